"""Clients' arrays as the rows the rules and attacks work on: one flat float64 vector per
client, in one key order, and back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

Arrays = Mapping[str, np.ndarray]


def flatten(arrays: Arrays, keys: Sequence[str]) -> np.ndarray:
    """The arrays under `keys`, in that order, as one float64 vector."""
    return np.concatenate([np.asarray(arrays[k], dtype=np.float64).ravel() for k in keys])


def unflatten(row: np.ndarray, template: Arrays, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """`row` cut back into arrays of the template's shapes and dtypes (integers, such as
    BatchNorm's batch counter, rounded)."""
    out: dict[str, np.ndarray] = {}
    start = 0
    for key in keys:
        ref = np.asarray(template[key])
        part = row[start : start + ref.size].reshape(ref.shape)
        start += ref.size
        kind = ref.dtype.kind
        out[key] = part.astype(ref.dtype) if kind in "fc" else np.rint(part).astype(ref.dtype)
    if start != row.size:
        raise ValueError(f"a row of {row.size} values does not fit arrays of {start}")
    return out
