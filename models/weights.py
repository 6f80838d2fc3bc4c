"""A torch module's weights as NumPy arrays (its state dict), the form every message and
checkpoint carries; used by the clients and the server alike."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn


def get_weights(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in weights_view(model).items()}


def weights_view(model: nn.Module) -> dict[str, np.ndarray]:
    """The model's weights as arrays that share its memory (on the CPU): for encoding at once
    (pollen.core.protocol.reply copies them into the message); `get_weights` for arrays to
    keep."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def set_weights(model: nn.Module, weights: Mapping[str, np.ndarray]) -> None:
    """Every entry of the model's state dict from `weights` (strict; read-only arrays are
    copied first, as torch only wraps writable ones)."""
    state = {k: torch.from_numpy(_writable(np.asarray(v))) for k, v in weights.items()}
    model.load_state_dict(state, strict=True)


def _writable(array: np.ndarray) -> np.ndarray:
    return array if array.flags.writeable else array.copy()
