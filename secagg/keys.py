"""The cryptography of SecAgg+, all of it vetted code: key pairs on the NIST P-256 curve and
their serialisations (`cryptography`), key agreement (ECDH + HKDF-SHA256) and authenticated
encryption (Fernet: AES-128-CBC + HMAC-SHA256) of the shares (Flower's
`flwr.common.secure_aggregation.crypto.symmetric_encryption`), and Shamir's t-of-n secret sharing
over GF(2^128) (pycryptodome's `Crypto.Protocol.SecretSharing.Shamir`, which Flower's
`crypto.shamir` wraps; called here on each 16-byte block of a secret, without the padding
block Flower's wrapper adds, which would make the server's reconstruction of a 16-byte seed
cost twice as much).

Each client of a secure sum has two key pairs (Bonawitz et al., CCS 2017, Sec. 4): `c` encrypts
the shares it sends its neighbours, `s` agrees the pairwise masks with them; and a self-mask
seed `b` (16 random bytes, expanded to the mask's 256-bit key by HKDF). It shares `b` and the
private scalar of `s` (32 bytes) among its neighbours, t of whose shares rebuild either.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from Crypto.Protocol.SecretSharing import Shamir
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
    decrypt,
    encrypt,
    generate_shared_key,
)
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)

CURVE = ec.SECP256R1()
SECRET_BYTES = 32
"""A private scalar of P-256."""
SEED_BYTES = 16
"""A self-mask seed."""
_BLOCK = 16  # Shamir shares 16-byte blocks
_INDEX = 4  # a share's index, little-endian, before its blocks (Flower's layout)


class ShareError(ValueError):
    """A share or a ciphertext that does not decrypt, or is not for whom it says."""


def seed_hash(session: str, seed: bytes) -> bytes:
    """SHA-256 of a session and a self-mask seed: what a client commits to in the keys stage,
    so that the server can check the seed it rebuilds from shares."""
    return hashlib.sha256(session.encode() + b"/" + seed).digest()


def bundle_digest(session: str, client: int, advertised: Mapping[str, bytes]) -> bytes:
    """SHA-256 of what a client advertised in a session's keys stage (its public keys, its
    seed's hash, its verifying key: name -> bytes), with its id: what the graph's seed is drawn
    from (secagg.graph.seed_of) and what each client checks its neighbours' forwarded keys by."""
    h = hashlib.sha256(f"pollen-secagg-keys/{session}/{client}".encode())
    for name in sorted(advertised):
        value = bytes(advertised[name])
        h.update(name.encode() + b"=" + len(value).to_bytes(4, "big") + value)
    return h.digest()


def new_private_key() -> ec.EllipticCurvePrivateKey:
    """A fresh key pair from the operating system's randomness."""
    return ec.generate_private_key(CURVE)


def private_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The private scalar, big-endian in 32 bytes (what is shared, and stored)."""
    return key.private_numbers().private_value.to_bytes(SECRET_BYTES, "big")


def private_key(scalar: bytes) -> ec.EllipticCurvePrivateKey:
    """The key pair of a private scalar (`private_bytes`)."""
    if len(scalar) != SECRET_BYTES:
        raise ShareError(f"a private scalar has {SECRET_BYTES} bytes, got {len(scalar)}")
    try:
        return ec.derive_private_key(int.from_bytes(scalar, "big"), CURVE)
    except ValueError as exc:
        raise ShareError(f"not a private scalar of P-256: {exc}") from None


def public_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The public key as a compressed point (33 bytes)."""
    return key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint
    )


def public_key(data: bytes) -> ec.EllipticCurvePublicKey:
    """A public key from its compressed point; ShareError if it is not one of P-256."""
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(CURVE, bytes(data))
    except ValueError as exc:
        raise ShareError(f"not a public key of P-256: {exc}") from None


def agreed_key(own: ec.EllipticCurvePrivateKey, peer: bytes) -> bytes:
    """The 32-byte secret two clients agree on from one's private and the other's public key
    (ECDH, then HKDF-SHA256: Flower's `generate_shared_key`)."""
    return base64.urlsafe_b64decode(generate_shared_key(own, public_key(peer)))


def fernet_key(agreed: bytes) -> bytes:
    """The key Fernet takes (url-safe base64) of an agreed secret."""
    return base64.urlsafe_b64encode(agreed)


@dataclass(frozen=True)
class Shares:
    """One client's shares of a neighbour's two secrets (or of its own)."""

    b: bytes
    s: bytes


def split(secret: bytes, threshold: int, count: int) -> list[bytes]:
    """`count` Shamir shares of `secret` (a multiple of 16 bytes), any `threshold` of which
    rebuild it: share i is its index i (1 to count) then its share of each 16-byte block."""
    if not 2 <= threshold <= count:
        raise ValueError(f"need 2 <= threshold <= shares, got {threshold} of {count}")
    if not secret or len(secret) % _BLOCK:
        raise ValueError(f"a secret to share has a multiple of {_BLOCK} bytes, got {len(secret)}")
    out = [bytearray(i.to_bytes(_INDEX, "little")) for i in range(1, count + 1)]
    for start in range(0, len(secret), _BLOCK):
        for index, share in Shamir.split(threshold, count, secret[start : start + _BLOCK], False):
            out[index - 1] += share
    return [bytes(s) for s in out]


def combine(shares: list[bytes]) -> bytes:
    """The secret rebuilt from shares (the threshold of them: more are not used); ShareError
    when they are malformed. Shares of another secret, or fewer than the threshold, rebuild a
    wrong secret: the server checks what it rebuilds where it can."""
    sizes = {len(s) for s in shares}
    if not shares or len(sizes) != 1 or (sizes.pop() - _INDEX) % _BLOCK:
        raise ShareError("shares of different or malformed lengths")
    indices = [int.from_bytes(s[:_INDEX], "little") for s in shares]
    if len(set(indices)) != len(indices) or min(indices) < 1:
        raise ShareError("two shares with the same index, or an index below 1")
    blocks = (len(shares[0]) - _INDEX) // _BLOCK
    secret = bytearray()
    for b in range(blocks):
        start = _INDEX + b * _BLOCK
        part = [(i, bytes(s[start : start + _BLOCK])) for i, s in zip(indices, shares, strict=True)]
        secret += Shamir.combine(part, ssss=False)
    return bytes(secret)


def seal(key: bytes, src: int, dst: int, shares: Shares) -> bytes:
    """`src`'s shares for `dst`, encrypted and authenticated under their agreed key."""
    return encrypt(fernet_key(key), share_keys_plaintext_concat(src, dst, shares.b, shares.s))


def unseal(key: bytes, src: int, dst: int, ciphertext: bytes) -> Shares:
    """The shares `src` sealed for `dst`; ShareError when the ciphertext does not authenticate
    under the agreed key or names other clients."""
    try:
        plain = decrypt(fernet_key(key), bytes(ciphertext))
    except Exception as exc:  # cryptography.fernet.InvalidToken and malformed tokens
        raise ShareError(
            f"shares from client {src} do not decrypt ({type(exc).__name__})"
        ) from None
    actual_src, actual_dst, b, s = share_keys_plaintext_separate(plain)
    if (actual_src, actual_dst) != (src, dst):
        raise ShareError(
            f"shares said to be from client {src} to {dst} are from {actual_src} to {actual_dst}"
        )
    return Shares(b, s)


# ---- the consistency round: signatures on the list of the sum's clients ---------------------
def new_signing_key() -> ed25519.Ed25519PrivateKey:
    """A fresh Ed25519 signing key (the consistency round: Bonawitz et al., CCS 2017, Sec. 4,
    the malicious-server variant's ConsistencyCheck)."""
    return ed25519.Ed25519PrivateKey.generate()


def signing_private_bytes(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def signing_key(data: bytes) -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.from_private_bytes(bytes(data))


def verify_key_bytes(key: ed25519.Ed25519PrivateKey) -> bytes:
    """The public key that checks `key`'s signatures, 32 raw bytes."""
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _members_message(session: str, graph: bytes, members: list[int]) -> bytes:
    return hashlib.sha256(f"{session}/{graph.hex()}/sum/{sorted(members)}".encode()).digest()


def sign_members(
    key: ed25519.Ed25519PrivateKey, session: str, graph: bytes, members: list[int]
) -> bytes:
    """A signature on the session's graph (its seed: the keys every client advertised) and
    the list of the clients in its sum."""
    return key.sign(_members_message(session, graph, members))


def signed_members(
    public: bytes, signature: bytes, session: str, graph: bytes, members: list[int]
) -> bool:
    """Whether `signature` is the holder of `public`'s on this session's graph and list."""
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(bytes(public)).verify(
            bytes(signature), _members_message(session, graph, members)
        )
    except (InvalidSignature, ValueError):
        return False
    return True


# ---- binding a client's keys to its node's authentication key ------------------------------
class NodeKeyError(ValueError):
    """A node key (or a directory of them) that cannot be read or is of no supported kind."""


def _node_message(digest: bytes) -> bytes:
    return b"pollen-secagg-node-signature/" + bytes(digest)


def node_key_id(public: ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey) -> bytes:
    """SHA-256 of a node's public key in OpenSSH form: how the server names the key that
    signed a client's advertised keys."""
    raw = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return hashlib.sha256(raw).digest()


def node_sign(private: object, digest: bytes) -> bytes:
    """The node's signature (ECDSA with SHA-256 for an EC key, as `ssh-keygen -t ecdsa`
    makes SuperNode keys; Ed25519 otherwise) on the digest of the keys it advertised
    (`bundle_digest`, which names the session and the client)."""
    if isinstance(private, ec.EllipticCurvePrivateKey):
        return private.sign(_node_message(digest), ec.ECDSA(hashes.SHA256()))
    if isinstance(private, ed25519.Ed25519PrivateKey):
        return private.sign(_node_message(digest))
    raise NodeKeyError(f"a node key of type {type(private).__name__} cannot sign; give an ECDSA "
                       "or Ed25519 key")  # fmt: skip


def node_signed(public: object, signature: bytes, digest: bytes) -> bool:
    """Whether `signature` is `public`'s on `digest` (`node_sign`)."""
    try:
        if isinstance(public, ec.EllipticCurvePublicKey):
            public.verify(bytes(signature), _node_message(digest), ec.ECDSA(hashes.SHA256()))
        elif isinstance(public, ed25519.Ed25519PublicKey):
            public.verify(bytes(signature), _node_message(digest))
        else:
            return False
    except (InvalidSignature, ValueError):
        return False
    return True


def read_node_key(path: Path) -> ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey:
    """A node's private key (OpenSSH or PEM, unencrypted); NodeKeyError naming the file."""
    try:
        data = path.read_bytes()
        key = (
            serialization.load_ssh_private_key(data, password=None)
            if b"OPENSSH PRIVATE KEY" in data
            else serialization.load_pem_private_key(data, password=None)
        )
    except (OSError, ValueError, TypeError) as exc:
        raise NodeKeyError(f"node key {path} cannot be read as a private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise NodeKeyError(f"node key {path} is a {type(key).__name__}, not ECDSA or Ed25519")
    return key


def read_peer_keys(
    directory: Path,
) -> dict[bytes, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey]:
    """The registered nodes' public keys (the `*.pub` files of `directory`, OpenSSH, as the
    SuperLink's allow-list), by `node_key_id`; NodeKeyError naming a file that is not one, or
    a directory that holds none."""
    out: dict[bytes, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey] = {}
    try:
        files = sorted(directory.glob("*.pub"))
    except OSError as exc:
        raise NodeKeyError(f"peer keys {directory} cannot be read ({exc})") from None
    for path in files:
        try:
            key = serialization.load_ssh_public_key(path.read_bytes())
        except (OSError, ValueError, TypeError, IndexError) as exc:
            raise NodeKeyError(f"peer key {path} is not an OpenSSH public key ({exc})") from None
        if not isinstance(key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
            raise NodeKeyError(f"peer key {path} is a {type(key).__name__}, not ECDSA or Ed25519")
        out[node_key_id(key)] = key
    if not out:
        raise NodeKeyError(f"peer keys {directory}: no *.pub file in it")
    return out
