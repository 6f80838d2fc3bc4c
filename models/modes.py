"""A model's training or evaluation mode, switched cheaply: a process that answers many clients
(a simulation worker) switches its models twice for every client it answers."""

from __future__ import annotations

from torch import nn

_MODULE_TRAIN = nn.Module.train


def set_training(model: nn.Module, mode: bool = True) -> nn.Module:
    """`model.train(mode)` (`mode=False`: `model.eval()`), with the same result. When no module
    of the model overrides `train`, each module's flag is set directly, as Module.train sets it
    (an instance attribute), without its per-module `__setattr__` and recursion; otherwise
    torch's `train` runs, overrides included."""
    modules = list(model.modules())
    if any(type(m).train is not _MODULE_TRAIN for m in modules):
        return model.train(mode)
    for m in modules:
        m.__dict__["training"] = mode
    return model
