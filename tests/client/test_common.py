"""DP-SGD as the classifier handlers run it (client.common): the ledger in the client's state,
a round replayed after a restart still counted, private or reproducible randomness, and the
model every side builds for DP-SGD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from client import fedavg
from client.common import new_model
from client.env import ClientEnv
from models.weights import get_weights
from pollen.core import protocol
from pollen.core.runconfig import resolve
from strategies.classifier import initial_weights


def _env(run_config: dict[str, Any], tmp_path: Path, **extra: Any) -> ClientEnv:
    settings = resolve({**run_config, **extra})
    return ClientEnv(0, settings, tmp_path / "state", "run", Path(str(settings["cache-dir"])), None)


def _train(env: ClientEnv, rnd: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    torch.manual_seed(0)  # the same received model every time
    model = new_model(env)
    content = protocol.instruction(rnd, "train", {"lr": 0.1}, arrays=get_weights(model))
    reply = fedavg.train(content, env)
    return dict(protocol.metrics_of(reply)), protocol.arrays_of(reply)


def test_the_ledger_lives_in_the_state_and_counts_a_replayed_round(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    env = _env(run_config, tmp_path, **{"dp.noise-multiplier": 1.0, "dp.reproducible": True})
    per_round = int(np.ceil(len(env.data.train) / 16))  # batch size 16, one epoch
    first, _ = _train(env, 1)
    assert first["dp-steps"] == per_round and first["noise-multiplier"] == 1.0
    saved = env.state.load(before_round=2)
    assert saved is not None and saved[1]["dp-ledger"] == [[1.0, 1 / per_round, per_round]]
    # the server restarted and asks for round 1 again: the first answer may have left already
    again, _ = _train(env, 1)
    assert again["dp-steps"] == 2 * per_round and again["epsilon"] > first["epsilon"]
    later, _ = _train(env, 2)
    assert later["dp-steps"] == 3 * per_round


@pytest.mark.parametrize("reproducible", [True, False])
def test_noise_and_batches_are_private_unless_reproducible(
    run_config: dict[str, Any], tmp_path: Path, reproducible: bool
) -> None:
    extra = {"dp.noise-multiplier": 1.0, "dp.reproducible": reproducible}
    _, a = _train(_env(run_config, tmp_path / "a", **extra), 1)
    _, b = _train(_env(run_config, tmp_path / "b", **extra), 1)
    same = all(np.array_equal(a[k], b[k]) for k in a)
    assert same == reproducible


def test_a_round_answered_twice_draws_the_same_private_noise(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """An instruction sent again (docs/reliability.md) is answered from the same state: its
    batches and noise come from the client's secret and the round, so the second answer is
    the first, bit for bit, and releases nothing new; the next round draws anew."""
    env = _env(run_config, tmp_path, **{"dp.noise-multiplier": 1.0})
    _, first = _train(env, 1)
    _, again = _train(env, 1)
    _, later = _train(env, 2)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert not all(np.array_equal(first[k], later[k]) for k in first)


def test_client_and_server_build_the_same_dp_model(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """mobilenet-v2's BatchNorms become GroupNorms on both sides, so the weights the server
    sends are the ones the client's model holds."""
    env = _env(run_config, tmp_path, model="mobilenet-v2", **{"dp.noise-multiplier": 1.0})
    model = new_model(env)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    server = initial_weights(env.settings, 0)
    client = get_weights(model)
    assert {k: v.shape for k, v in server.items()} == {k: v.shape for k, v in client.items()}
