"""secagg.masks: uniform integers modulo 2^b from a key, the same for the same key, unrelated for
different keys or sessions."""

from __future__ import annotations

import numpy as np
import pytest

from secagg import masks


def test_a_mask_is_uniform_modulo_the_power_of_two() -> None:
    for bits in (8, 32, 64):
        m = masks.mask(masks.derive_key(b"k" * 32, "test"), 200_000, bits)
        assert m.dtype == np.uint64
        if bits < 64:
            assert int(m.max()) < 2**bits
        # every one of the b bits is set about half of the time
        for b in range(0, bits, max(1, bits // 8)):
            share = float(((m >> np.uint64(b)) & np.uint64(1)).mean())
            assert abs(share - 0.5) < 0.005
        # 16 equal bins of the range: a chi-square test at 1e-6
        top = (m >> np.uint64(bits - 4)) if bits > 4 else m
        counts = np.bincount(top.astype(np.int64), minlength=16)
        expected = m.size / 16
        assert ((counts - expected) ** 2 / expected).sum() < 52.0  # chi2(15) at p = 1e-6


def test_a_key_gives_one_stream_and_different_keys_unrelated_ones() -> None:
    key = masks.derive_key(b"x" * 32, "session-1")
    assert np.array_equal(masks.mask(key, 1000, 32), masks.mask(key, 1000, 32))
    # a longer stream starts with the shorter one (masks of any size agree on their prefix)
    assert np.array_equal(masks.mask(key, 3_000_000, 32)[:1000], masks.mask(key, 1000, 32))
    other = masks.derive_key(b"x" * 32, "session-2")
    a, b = masks.mask(key, 100_000, 32), masks.mask(other, 100_000, 32)
    assert float(np.mean(a == b)) < 1e-3
    assert abs(np.corrcoef(a.astype(float), b.astype(float))[0, 1]) < 0.02


def test_keys_are_bound_to_their_purpose() -> None:
    seed = bytes(range(16))
    assert masks.self_key(seed, "s") != masks.pairwise_key(seed, "s")
    assert masks.self_key(seed, "s") != masks.self_key(seed, "t")
    assert len(masks.self_key(seed, "s")) == masks.KEY_BYTES


def test_pairwise_signs_cancel() -> None:
    assert masks.pairwise_sign(3, 7) == -masks.pairwise_sign(7, 3) == 1


def test_short_or_malformed_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="fewer than 16"):
        masks.derive_key(b"short", "x")
    with pytest.raises(ValueError, match="32 bytes"):
        masks.mask(b"k" * 16, 10, 32)
    with pytest.raises(ValueError, match="modulus bits"):
        masks.mask(b"k" * 32, 10, 65)
