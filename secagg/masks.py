"""The masks of a secure sum: uniform integers modulo R = 2^b, expanded from a 256-bit key by
ChaCha20 (`cryptography`'s), the stream cipher run over zeros.

The key of a mask is derived with HKDF-SHA256 from its secret material (a pairwise key agreed
between two clients, or a client's self-mask seed) and the session it masks in, so that the
same material never masks two sessions alike. Every 32 bits of key stream give one integer
(64 bits for a modulus above 2^32), reduced modulo R by keeping its low b bits: uniform over
[0, R) since R divides 2^32 (2^64). (Flower's
`pseudo_rand_gen` folds the seed to 32 bits and draws from NumPy's Mersenne Twister: a server
could try every seed.)
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
_NONCE = bytes(16)  # each key masks one stream: a fixed nonce is safe
_CHUNK = 1 << 20  # values per call into the cipher


def derive_key(material: bytes, purpose: str) -> bytes:
    """A 256-bit key from secret `material`, bound to `purpose` (the session and what the key
    is for) by HKDF-SHA256."""
    if len(material) < 16:
        raise ValueError("key material of fewer than 16 bytes")
    return HKDF(
        algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=purpose.encode()
    ).derive(material)


def self_key(seed: bytes, session: str) -> bytes:
    """The key of a client's self mask in a session, from its self-mask seed."""
    return derive_key(seed, f"pollen secagg self {session}")


def pairwise_key(agreed: bytes, session: str) -> bytes:
    """The key of the mask two clients share in a session, from the secret they agreed on."""
    return derive_key(agreed, f"pollen secagg pairwise {session}")


def pairwise_sign(own: int, peer: int) -> int:
    """+1: the client of the lower id adds the pair's mask; -1: the other subtracts it."""
    return 1 if own < peer else -1


def mask(key: bytes, size: int, modulus_bits: int) -> np.ndarray:
    """`size` integers uniform modulo 2^modulus_bits (uint64), the key stream of ChaCha20 under
    `key`."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"a mask key has {KEY_BYTES} bytes, got {len(key)}")
    if not 1 <= modulus_bits <= 64:
        raise ValueError(f"modulus bits must be in [1, 64], got {modulus_bits}")
    encryptor = Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor()
    width = 4 if modulus_bits <= 32 else 8  # key-stream bytes a value: as few as the modulus needs
    out = np.empty(size, dtype=f"<u{width}")  # little-endian on every machine
    view = out.view(np.uint8)
    for start in range(0, size, _CHUNK):
        stop = min(size, start + _CHUNK)
        zeros = bytes(width * (stop - start))
        view[width * start : width * stop] = np.frombuffer(encryptor.update(zeros), np.uint8)
    values = out.astype(np.uint64)
    if modulus_bits < 64:
        values &= np.uint64((1 << modulus_bits) - 1)
    return values
