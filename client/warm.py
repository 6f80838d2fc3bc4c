"""Models kept warm in a process that answers many clients in turn (a simulation worker, a
node's resident worker): a client that receives a model gets one of the run's models that an
earlier client of this process is done with, its every weight overwritten, instead of a model
built and randomly initialised again.

A model is lent for one client's message (`lending`, which client.dispatch.answer opens): when
the handler returns, the models it was lent go back to the free list, their gradients dropped
and training mode restored, so the next client gets what a fresh model holding the same
weights would be. Outside `lending` (a handler called directly), and for models that training
changes beyond their weights (DP-SGD's Opacus hooks), every model is a fresh copy.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from client.env import ClientEnv
from pollen.core.protection import DPSettings
from pollen.core.runmodel import run_model
from pollen.core.settings import settings_key

if TYPE_CHECKING:
    import numpy as np
    from torch import nn

MOST_FREE = 8
"""Free models kept per run (FedEM's clients hold one per component at once)."""

MOST_RUNS = 4
"""Runs whose models a process keeps (a process serves one run at a time)."""


class _Kept(threading.local):
    """Per thread: what is lent to the client being answered in it, and what is free."""

    def __init__(self) -> None:
        self.depth = 0
        self.lent: list[tuple[object, nn.Module]] = []
        self.free: dict[object, list[nn.Module]] = {}
        self.templates: dict[object, nn.Module] = {}


_kept = _Kept()


@contextmanager
def lending() -> Iterator[None]:
    """Models taken by `received_model` inside go back to the free list at the end."""
    _kept.depth += 1
    try:
        yield
    finally:
        _kept.depth -= 1
        if _kept.depth == 0:
            lent, _kept.lent = _kept.lent, []
            for key, model in lent:
                free = _kept.free.setdefault(key, [])
                if len(free) < MOST_FREE:
                    free.append(_fresh(model))


def _fresh(model: nn.Module) -> nn.Module:
    for p in model.parameters():
        p.grad = None
    if not all(m.training for m in model.modules()):  # most come back from training
        model.train()
    return model


def received_model(env: ClientEnv, weights: Mapping[str, np.ndarray]) -> nn.Module:
    """The run's model on the client's device holding `weights` (every entry of its state
    dict, checked): a free one of this process when there is one (see the module's text),
    else a copy of the run's model as first built here."""
    from models.weights import set_weights  # lazy: torch (client.app imports this module)

    key = _key(env)
    if key is None:
        model = run_model(env.settings, env.model_fn).to(env.device)
    else:
        free = _kept.free.get(key)
        model = free.pop() if free else copy.deepcopy(_template(key, env)).to(env.device)
        if _kept.depth > 0:
            _kept.lent.append((key, model))
    set_weights(model, weights)  # read-only views too: copied into the model's tensors
    return model


def _key(env: ClientEnv) -> object | None:
    """What fixes a run's model in this process; None: build each model afresh (settings that
    are not hashable; DP-SGD, whose Opacus hooks stay on the model it trains)."""
    contents = settings_key(env.settings)
    if contents is None or DPSettings.of(env.settings).enabled:
        return None
    return (contents, env.model_fn, str(env.device))


def _template(key: object, env: ClientEnv) -> nn.Module:
    """The run's model as first built in this process (on the CPU, never trained)."""
    model = _kept.templates.get(key)
    if model is None:
        if len(_kept.templates) >= MOST_RUNS:
            _kept.templates.clear()
            _kept.free.clear()
        model = _kept.templates[key] = run_model(env.settings, env.model_fn)
    return model
