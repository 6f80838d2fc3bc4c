"""Type-normalising a synthetic generator's parameters, with one line naming a bad one."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from federated_data.errors import DataConfigError


def typed_params(
    params: Mapping[str, Any],
    defaults: Mapping[str, int | float | str],
    where: str,
    integers: Iterable[str],
    reals: Iterable[str],
) -> dict[str, Any]:
    """`integers` as non-negative ints and `reals` as finite floats >= 0; every key of
    `defaults` must be present. A train_size of 0 (the run settings' default, shared by the
    generators) becomes the generator's own default. DataConfigError names a bad parameter."""
    missing = sorted(set(defaults) - set(params))
    if missing:
        raise DataConfigError(f"{where}: missing parameter(s) {', '.join(missing)}")
    out: dict[str, Any] = {}
    for name in integers:
        value = params[name]
        if isinstance(value, bool) or not float(value).is_integer() or value < 0:
            raise DataConfigError(f"{where}: {name} must be a non-negative integer, got {value!r}")
        out[name] = int(value)
    for name in reals:
        value = params[name]
        if isinstance(value, bool) or not math.isfinite(float(value)) or float(value) < 0:
            raise DataConfigError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
        out[name] = float(value)
    if out.get("train_size") == 0:
        out["train_size"] = int(defaults["train_size"])
    return out
