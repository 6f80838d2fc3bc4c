"""What a client contributes to a secure sum, as integers modulo R = 2^modulus_bits, and the sum
decoded again.

A client's vector x (its update, flattened) is clipped coordinate-wise to [-c, c], multiplied by
its weight a in [0, 1] and scaled so that c becomes 2^(bits-1): each value is then an integer of
at most `bits` bits, sign included. The scaling is fixed-point with stochastic rounding (a value
y becomes floor(y) + 1 with probability y - floor(y)), so that rounding is unbiased; its draws
come from a generator the caller seeds (the same reply for the same seed, never NumPy's global
generator). The weight travels inside the vector as its last coordinate, the integer
w = round(a 2^(bits-1)), and the values are scaled by exactly w / 2^(bits-1): the sum gives
sum_i a_i x_i and sum_i a_i with no extra error, and the server divides after unmasking.

Integers travel modulo R (unsigned, two's complement), where masks are uniform. The sum of n
vectors is decoded by reading it centred, in [-R/2, R/2): it is exact as long as
|sum| < R/2, i.e. R > n 2^bits (plus the tail of any integer noise added for distributed DP);
`modulus_bits_for` gives the smallest such power of two and the settings refuse a smaller one
before anything starts.

Quantization error: each client's encoded value is within one step D = c / 2^(bits-1) of a x
(stochastic rounding moves it by less than one unit), so the decoded sum of n clients is within
n D of sum_i a_i clip(x_i), and the weighted mean within n D / sum_i a_i of the mean of the
clipped values (`mean_error_bound`); the expected error is 0 and its standard deviation at most
sqrt(n) D / (2 sum_i a_i). Values outside [-c, c] are clipped; the client reports the share it
clipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_MODULUS_BITS = 64
"""Sums travel as 64-bit unsigned integers at most."""


@dataclass(frozen=True)
class Encoding:
    """Fixed-point integers modulo 2^modulus_bits: values in [-clip, clip] scaled to at most
    2^(bits-1) in magnitude."""

    clip: float
    bits: int
    modulus_bits: int

    def __post_init__(self) -> None:
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError(f"the clipping range must be positive, got {self.clip}")
        if not 2 <= self.bits < self.modulus_bits <= MAX_MODULUS_BITS:
            raise ValueError(
                f"need 2 <= bits < modulus bits <= {MAX_MODULUS_BITS}, got bits={self.bits} "
                f"and modulus bits={self.modulus_bits}"
            )

    @property
    def unit(self) -> int:
        """The integer that stands for the value `clip` (and for the weight 1)."""
        return 1 << (self.bits - 1)

    @property
    def scale(self) -> float:
        """Integer units per unit of value."""
        return self.unit / self.clip

    @property
    def step(self) -> float:
        """D: the value of one integer unit, the largest rounding error of one client."""
        return self.clip / self.unit

    @property
    def modulus(self) -> int:
        return 1 << self.modulus_bits

    @property
    def dtype(self) -> np.dtype[np.unsignedinteger]:
        """The wire type of a masked vector: 4 bytes a value up to 2^32, else 8."""
        return np.dtype(np.uint32 if self.modulus_bits <= 32 else np.uint64)


def modulus_bits_for(bits: int, clients: int, tail: float = 0.0) -> int:
    """The fewest modulus bits whose sums of `clients` vectors of `bits`-bit integers (and of
    noise within +-`tail`) never wrap: R / 2 > clients 2^(bits-1) + tail."""
    largest = clients * (1 << (bits - 1)) + math.ceil(tail)
    return max(bits + 1, largest.bit_length() + 1)


def weight_units(weight: float, enc: Encoding) -> int:
    """A weight in [0, 1] as the integer w = round(weight 2^(bits-1)) the vector carries
    (weights above 1 count as 1, below 0 as 0)."""
    if not math.isfinite(weight):
        raise ValueError(f"weight {weight!r} is not finite")
    return int(min(max(round(weight * enc.unit), 0), enc.unit))


def encode(
    values: np.ndarray, weight: int, enc: Encoding, rng: np.random.Generator
) -> tuple[np.ndarray, float]:
    """`values` (float, flattened) clipped to [-clip, clip], times weight / 2^(bits-1), scaled
    and stochastically rounded to int64, with the weight (`weight_units`) appended; and the
    share of values the clipping changed."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if not np.isfinite(x).all():
        raise ValueError("a value to encode is NaN or infinite")
    clipped = float(np.mean(np.abs(x) > enc.clip)) if x.size else 0.0
    y = np.clip(x, -enc.clip, enc.clip) * (enc.scale * (weight / enc.unit))
    low = np.floor(y)
    up = rng.random(y.shape) < (y - low)
    out = np.empty(x.size + 1, dtype=np.int64)
    np.add(low.astype(np.int64), up, out=out[:-1], casting="unsafe")
    out[-1] = weight
    return out, clipped


def to_ring(x: np.ndarray, enc: Encoding) -> np.ndarray:
    """Signed integers as residues modulo R, in the wire type (two's complement)."""
    return (np.asarray(x, dtype=np.int64).view(np.uint64) & np.uint64(enc.modulus - 1)).astype(
        enc.dtype
    )


def add(total: np.ndarray, x: np.ndarray, enc: Encoding) -> np.ndarray:
    """total + x modulo R, in uint64 (uint64 arithmetic wraps modulo 2^64, a multiple of R)."""
    return (np.asarray(total, np.uint64) + np.asarray(x, np.uint64)) & np.uint64(enc.modulus - 1)


def subtract(total: np.ndarray, x: np.ndarray, enc: Encoding) -> np.ndarray:
    """total - x modulo R, in uint64."""
    return (np.asarray(total, np.uint64) - np.asarray(x, np.uint64)) & np.uint64(enc.modulus - 1)


def centred(total: np.ndarray, enc: Encoding) -> np.ndarray:
    """Residues modulo R read as the signed integers in [-R/2, R/2) they stand for."""
    t = np.asarray(total, np.uint64) & np.uint64(enc.modulus - 1)
    if enc.modulus_bits == MAX_MODULUS_BITS:
        return t.view(np.int64).copy()
    signed = t.astype(np.int64)
    signed[signed >= enc.modulus // 2] -= enc.modulus
    return signed


def decode(total: np.ndarray, enc: Encoding) -> tuple[np.ndarray, float]:
    """The sum of encoded vectors (residues modulo R) as (sum_i a_i x_i in float64, sum_i a_i)."""
    t = centred(total, enc)
    return t[:-1].astype(np.float64) * enc.step, float(t[-1]) / enc.unit


def mean_error_bound(count: int, weight: float, enc: Encoding) -> float:
    """The largest difference, on any coordinate, between the decoded weighted mean of `count`
    clients whose weights add up to `weight` and the exact weighted mean of their clipped
    values: count D / weight."""
    if weight <= 0:
        raise ValueError(f"the weights add up to {weight}: nothing to average")
    return count * enc.step / weight


def rounded_l2_bound(l2: float, size: int, enc: Encoding) -> float:
    """A bound, in integer units, on the l2 norm of an encoded vector of `size` values whose
    l2 norm is at most `l2` (weight 1): rounding moves each coordinate by less than one unit,
    so the norm grows by less than sqrt(size)."""
    return l2 * enc.scale + math.sqrt(size)
