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
    """Every entry of the model's state dict from `weights`, strictly. Copied straight into
    the model's CPU tensors when the names, shapes and types all match and the model has no
    state-dict hooks (read-only arrays, e.g. views of a message, are fine); otherwise through
    load_state_dict, which converts types and names what differs (read-only arrays are copied
    first, as torch only wraps writable ones)."""
    if _copied_into(model, weights):
        return
    state = {k: torch.from_numpy(_writable(np.asarray(v))) for k, v in weights.items()}
    model.load_state_dict(state, strict=True)


def _copied_into(model: nn.Module, weights: Mapping[str, np.ndarray]) -> bool:
    """Whether `weights` could be and were copied into the tensors of the model's state dict."""
    hooks = (model._state_dict_hooks, model._state_dict_pre_hooks,
             model._load_state_dict_pre_hooks, model._load_state_dict_post_hooks)  # fmt: skip
    if any(hooks):
        return False  # e.g. models.privacy's renaming: load_state_dict applies them
    state = model.state_dict()
    if state.keys() != weights.keys() or any(t.device.type != "cpu" for t in state.values()):
        return False
    try:
        pairs = [(t.numpy(), np.asarray(weights[k])) for k, t in state.items()]
    except TypeError:  # a tensor type NumPy lacks (bfloat16)
        return False
    if not all(t.shape == a.shape and t.dtype == a.dtype for t, a in pairs):
        return False
    for target, source in pairs:
        np.copyto(target, source, casting="no")
    return True


def _writable(array: np.ndarray) -> np.ndarray:
    return array if array.flags.writeable else array.copy()
