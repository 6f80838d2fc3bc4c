"""secagg.keys: Shamir's t-of-n (any t shares rebuild, fewer do not), key agreement, and sealed
shares that open only for whom they are meant."""

from __future__ import annotations

import itertools
import os

import pytest

from secagg import keys


def test_any_threshold_of_the_shares_rebuilds_the_secret() -> None:
    secret = os.urandom(32)
    shares = keys.split(secret, 3, 5)
    assert {len(s) for s in shares} == {4 + 32}
    for subset in itertools.combinations(shares, 3):
        assert keys.combine(list(subset)) == secret
    assert keys.combine(shares) == secret


def test_fewer_shares_than_the_threshold_rebuild_something_else() -> None:
    secret = os.urandom(16)
    shares = keys.split(secret, 4, 7)
    assert all(keys.combine(list(s)) != secret for s in itertools.combinations(shares, 3))


def test_malformed_shares_are_refused() -> None:
    shares = keys.split(os.urandom(16), 2, 3)
    with pytest.raises(keys.ShareError, match="same index"):
        keys.combine([shares[0], shares[0]])
    with pytest.raises(keys.ShareError, match="lengths"):
        keys.combine([shares[0], shares[1][:-1]])
    with pytest.raises(ValueError, match="threshold"):
        keys.split(os.urandom(16), 1, 3)
    with pytest.raises(ValueError, match="multiple of 16"):
        keys.split(os.urandom(20), 2, 3)


def test_both_sides_agree_on_one_key() -> None:
    a, b = keys.new_private_key(), keys.new_private_key()
    assert keys.agreed_key(a, keys.public_bytes(b)) == keys.agreed_key(b, keys.public_bytes(a))
    assert keys.private_key(keys.private_bytes(a)).private_numbers() == a.private_numbers()
    with pytest.raises(keys.ShareError, match="not a public key"):
        keys.public_key(b"\x05" + bytes(32))


def test_sealed_shares_open_only_for_their_receiver() -> None:
    a, b, c = (keys.new_private_key() for _ in range(3))
    ab = keys.agreed_key(a, keys.public_bytes(b))
    shares = keys.Shares(b"\x01" * 20, b"\x02" * 36)
    sealed = keys.seal(ab, 1, 2, shares)
    assert keys.unseal(keys.agreed_key(b, keys.public_bytes(a)), 1, 2, sealed) == shares
    with pytest.raises(keys.ShareError, match="do not decrypt"):
        keys.unseal(keys.agreed_key(c, keys.public_bytes(a)), 1, 2, sealed)
    with pytest.raises(keys.ShareError, match="are from"):
        keys.unseal(ab, 1, 3, sealed)  # said to be for client 3
    tampered = bytearray(sealed)
    tampered[40] ^= 1
    with pytest.raises(keys.ShareError, match="do not decrypt"):
        keys.unseal(ab, 1, 2, bytes(tampered))


def test_the_seed_hash_binds_the_session() -> None:
    seed = os.urandom(16)
    assert keys.seed_hash("a", seed) != keys.seed_hash("b", seed)
    assert len(keys.seed_hash("a", seed)) == 32
