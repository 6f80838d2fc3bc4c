"""Low-rank linear layers for FeDLRT: W = U S V^T, applied without ever forming W.

A network's chosen `nn.Linear` layers are swapped for `LowRankLinear` modules; its other
parameters stay dense. On the wire a factorized layer `<name>` is `<name>.U` (out×r),
`<name>.s` (r, the diagonal of S) and `<name>.V` (in×r), next to its dense `<name>.bias`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

FACTOR_SUFFIXES = (".U", ".s", ".V")


class LowRankLinear(nn.Module):
    """y = ((x V) S^T) U^T + b: O(batch·(in·r + r² + out·r)) instead of O(batch·in·out)."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
        super().__init__()
        self.U = nn.Parameter(torch.zeros(out_features, rank))
        self.S = nn.Parameter(torch.zeros(rank, rank))
        self.V = nn.Parameter(torch.zeros(in_features, rank))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ((x @ self.V) @ self.S.T) @ self.U.T
        return y + self.bias if self.bias is not None else y


def linear_layers(model: nn.Module) -> list[str]:
    return [name for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]


def select_layers(model: nn.Module, which: str) -> list[str]:
    """Names of the linear layers to factorize: 'hidden' (every one but the output layer),
    'all', or a comma-separated list of module names."""
    names = linear_layers(model)
    if which == "hidden":
        return names[:-1]
    if which == "all":
        return names
    wanted = [w.strip() for w in which.split(",") if w.strip()]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise ValueError(f"not linear layers of the model: {unknown}; linear layers: {names}")
    return wanted


def factorized_layers(arrays: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Layer name -> rank, read from the `<name>.U` arrays of a message."""
    return {
        key.removesuffix(".U"): int(value.shape[1])
        for key, value in arrays.items()
        if key.endswith(".U") and value.ndim == 2
    }


def to_low_rank(model: nn.Module, ranks: Mapping[str, int]) -> nn.Module:
    """Replace the named nn.Linear modules by LowRankLinear of the given ranks (in place)."""
    for name, rank in ranks.items():
        dense = model.get_submodule(name)
        if not isinstance(dense, nn.Linear):
            raise ValueError(f"{name!r} is not a linear layer")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = LowRankLinear(dense.in_features, dense.out_features, rank, dense.bias is not None)
        setattr(parent, child, layer.to(dense.weight.device))
    return model


def model_state(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Wire arrays -> the state dict of the low-rank model: the vector `<name>.s` becomes the
    diagonal matrix `<name>.S` (a full `<name>.S` is taken as it is)."""
    out: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        if key.endswith(".s") and key.removesuffix(".s") + ".U" in arrays:
            out[key.removesuffix(".s") + ".S"] = np.diag(value)
        else:
            out[key] = value
    return out


def load_low_rank(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> nn.Module:
    """A dense model turned into the low-rank model the arrays describe, with their values."""
    to_low_rank(model, factorized_layers(arrays))
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in model_state(arrays).items()}
    model.load_state_dict(state, strict=True)
    return model
