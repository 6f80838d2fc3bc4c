"""secagg.encoding: the quantization error bound the docs state, unbiased rounding, sums that
never wrap with the modulus `modulus_bits_for` gives, and decoding of negative sums."""

from __future__ import annotations

import numpy as np
import pytest

from secagg import encoding
from secagg.encoding import Encoding


def _sum(vectors: list[np.ndarray], enc: Encoding) -> np.ndarray:
    total = np.zeros(vectors[0].size, dtype=np.uint64)
    for v in vectors:
        total = encoding.add(total, encoding.to_ring(v, enc), enc)
    return total


@pytest.mark.parametrize("bits", [8, 16, 22])
@pytest.mark.parametrize("clients", [2, 7, 50])
def test_the_weighted_mean_is_within_the_stated_bound(bits: int, clients: int) -> None:
    rng = np.random.default_rng(bits * 100 + clients)
    clip = 2.0
    enc = Encoding(clip, bits, encoding.modulus_bits_for(bits, clients))
    xs = [rng.uniform(-3, 3, size=300) for _ in range(clients)]  # some beyond the range
    weights = [encoding.weight_units(float(w), enc) for w in rng.uniform(0.1, 1.0, clients)]
    encoded = [encoding.encode(x, w, enc, rng)[0] for x, w in zip(xs, weights, strict=True)]
    sums, total = encoding.decode(_sum(encoded, enc), enc)
    a = [w / enc.unit for w in weights]
    assert total == pytest.approx(sum(a), abs=1e-12)  # the weights travel exactly
    exact = sum(ai * np.clip(x, -clip, clip) for ai, x in zip(a, xs, strict=True)) / sum(a)
    error = np.abs(sums / total - exact).max()
    bound = encoding.mean_error_bound(clients, total, enc)
    assert error <= bound
    assert bound == pytest.approx(clients * clip / 2 ** (bits - 1) / sum(a))


def test_rounding_is_unbiased_and_seeded() -> None:
    enc = Encoding(1.0, 6, 16)  # coarse: a step of 1/32
    x = np.full(200_000, 0.3)  # 9.6 steps: rounded to 9 or 10, 10 with probability 0.6
    once, _ = encoding.encode(x, enc.unit, enc, np.random.default_rng(5))
    again, _ = encoding.encode(x, enc.unit, enc, np.random.default_rng(5))
    assert np.array_equal(once, again)
    assert set(np.unique(once[:-1])) == {9, 10}
    assert abs(float(once[:-1].mean()) * enc.step - 0.3) < 4 * enc.step / np.sqrt(x.size)


def test_the_clipped_share_is_reported() -> None:
    enc = Encoding(1.0, 10, 16)
    _, share = encoding.encode(np.array([0.5, -2.0, 3.0, 0.0]), enc.unit, enc,
                               np.random.default_rng(0))  # fmt: skip
    assert share == 0.5


@pytest.mark.parametrize(("bits", "clients"), [(22, 1024), (22, 1025), (8, 3), (30, 1000)])
def test_the_modulus_holds_the_largest_sum_of_either_sign(bits: int, clients: int) -> None:
    enc = Encoding(1.0, bits, encoding.modulus_bits_for(bits, clients))
    largest = np.array([1.0] * 3)
    top = [encoding.encode(largest, enc.unit, enc, np.random.default_rng(0))[0]] * clients
    low = [encoding.encode(-largest, enc.unit, enc, np.random.default_rng(0))[0]] * clients
    assert encoding.decode(_sum(top, enc), enc)[0] == pytest.approx([clients] * 3)
    assert encoding.decode(_sum(low, enc), enc)[0] == pytest.approx([-clients] * 3)
    # one bit fewer and the largest sum wraps
    small = Encoding(1.0, bits, enc.modulus_bits - 1)
    assert encoding.decode(_sum(top, small), small)[1] != pytest.approx(clients)


def test_modulus_bits_leave_room_for_noise() -> None:
    assert encoding.modulus_bits_for(22, 1024) == 33
    assert encoding.modulus_bits_for(22, 1024, tail=2**40) == 42


def test_sixty_four_bit_moduli_wrap_as_two_s_complement() -> None:
    enc = Encoding(1.0, 40, 64)
    x = np.array([-1.0, 0.5, -0.25])
    v, _ = encoding.encode(x, enc.unit, enc, np.random.default_rng(0))
    assert encoding.to_ring(v, enc).dtype == np.uint64
    assert encoding.decode(_sum([v, v], enc), enc)[0] == pytest.approx(2 * x)


def test_weights_are_clamped_to_the_unit_range() -> None:
    enc = Encoding(1.0, 10, 16)
    assert encoding.weight_units(1.7, enc) == enc.unit
    assert encoding.weight_units(-0.1, enc) == 0
    assert encoding.weight_units(0.5, enc) == enc.unit // 2
    with pytest.raises(ValueError, match="not finite"):
        encoding.weight_units(float("nan"), enc)


def test_bad_encodings_are_refused() -> None:
    with pytest.raises(ValueError, match="clipping range"):
        Encoding(0.0, 10, 16)
    with pytest.raises(ValueError, match="bits"):
        Encoding(1.0, 16, 16)
    with pytest.raises(ValueError, match="NaN"):
        encoding.encode(np.array([np.nan]), 1, Encoding(1.0, 4, 8), np.random.default_rng(0))


def test_the_rounded_norm_bound_holds() -> None:
    rng = np.random.default_rng(2)
    enc = Encoding(1.0, 12, 32)
    x = rng.standard_normal(1000)
    x *= 0.9 / np.linalg.norm(x)
    v, _ = encoding.encode(x, enc.unit, enc, rng)
    assert np.linalg.norm(v[:-1].astype(float)) <= encoding.rounded_l2_bound(0.9, x.size, enc)
