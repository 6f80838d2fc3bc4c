"""Models and partitions kept warm in a process that answers many clients in turn
(client.warm, client.env.ResidentData): what a client gets is what a fresh model and a fresh
read would give it, bit for bit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from client import env as client_env
from client import warm
from client.common import new_model
from client.dispatch import answer
from client.env import ClientEnv, ResidentData
from federated_data import ArrayDataset, ClientData
from models.weights import get_weights
from pollen.core import protocol
from pollen.core.runconfig import from_run_config


@pytest.fixture(autouse=True)
def _cold() -> Iterator[None]:
    """Each test starts with nothing kept in this thread."""
    warm._kept.__init__()  # type: ignore[misc]
    yield
    warm._kept.__init__()  # type: ignore[misc]


def _env(run_config: dict[str, Any], tmp_path: Path, cid: int, **extra: Any) -> ClientEnv:
    settings = from_run_config({**run_config, **extra})
    return ClientEnv(
        cid, settings, tmp_path / "state", "run", Path(str(settings["cache-dir"])), None
    )


def _weights(env: ClientEnv, seed: int) -> dict[str, np.ndarray]:
    torch.manual_seed(seed)
    return get_weights(new_model(env))


def _train(env: ClientEnv, weights: dict[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray]]:
    content = protocol.instruction(2, "train", {"lr": 0.1}, arrays=weights)
    reply = answer("train", content, env)
    return dict(protocol.metrics_of(reply)), protocol.arrays_of(reply)


def test_a_lent_model_goes_back_fresh_and_serves_the_next_client(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    env = _env(run_config, tmp_path, 0)
    first, second = _weights(env, 1), _weights(env, 2)
    with warm.lending():
        model = warm.received_model(env, first)
        model(torch.zeros(2, 64)).sum().backward()
        model.eval()
    assert all(p.grad is None for p in model.parameters()) and model.training
    with warm.lending():  # a model that comes back with only part of it in eval mode
        again = warm.received_model(env, first)
        next(again.children()).eval()
    assert again is model and all(m.training for m in model.modules())
    with warm.lending():
        again = warm.received_model(env, second)
        other = warm.received_model(env, second)  # a second model at once: another object
    assert again is model and other is not model
    for key, value in again.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), second[key])
    # outside a lending scope nothing is reused
    assert warm.received_model(env, first) is not warm.received_model(env, first)


def test_a_client_answered_with_a_reused_model_replies_what_a_fresh_one_would(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    a, b = _env(run_config, tmp_path / "a", 0), _env(run_config, tmp_path / "b", 1)
    start = _weights(a, 1)
    fresh = _train(b, start)  # nothing kept yet: b's model is built for it
    assert warm._kept.free  # ... and kept for the next client
    _train(a, _weights(a, 3))  # a trains on the kept model first
    warm._kept.free.clear()
    _train(a, _weights(a, 3))
    reused = _train(_env(run_config, tmp_path / "b2", 1), start)
    assert reused[0] == fresh[0]
    for key, value in fresh[1].items():
        assert np.array_equal(reused[1][key], value), key


def test_read_only_views_are_copied_into_the_model_and_a_mismatch_is_named(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    env = _env(run_config, tmp_path, 0)
    weights = _weights(env, 4)
    views = protocol.arrays_of(protocol.instruction(1, "train", arrays=weights), copy=False)
    assert not any(v.flags.writeable for v in views.values())
    with warm.lending():
        model = warm.received_model(env, views)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # the model's own memory, not the message's
    for key, value in views.items():
        np.testing.assert_array_equal(value, weights[key])
    missing = dict(list(weights.items())[1:])
    with pytest.raises(RuntimeError, match="Missing key"):
        warm.received_model(env, missing)
    wrong = {k: v.astype(np.float64) for k, v in weights.items()}  # another type: converted
    model = warm.received_model(env, wrong)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), weights[key])


def test_dp_sgd_models_are_never_reused(run_config: dict[str, Any], tmp_path: Path) -> None:
    env = _env(run_config, tmp_path, 0, **{"dp.noise-multiplier": 1.0})
    weights = get_weights(new_model(env))
    with warm.lending():
        model = warm.received_model(env, weights)
    with warm.lending():
        assert warm.received_model(env, weights) is not model
    assert not warm._kept.free


def _data(examples: int) -> ClientData:
    split = ArrayDataset(np.zeros((examples, 4), np.float32), np.zeros(examples, np.int64), 2)
    return ClientData(0, split, split, split)


def test_a_simulation_worker_keeps_partitions_up_to_its_bytes_newest_first() -> None:
    one = 3 * (10 * 4 * 4 + 10 * 8)  # three splits of 10 examples: x and y
    kept = ResidentData(limit=100, most_bytes=2 * one)
    for part in range(3):
        kept.keep(("spec", part, "cache"), _data(10))
    assert kept.get(("spec", 0, "cache")) is None  # the oldest went first
    assert kept.get(("spec", 1, "cache")) is not None
    assert kept.bytes == 2 * one
    kept.keep(("spec", 3, "cache"), _data(10))
    assert kept.get(("spec", 2, "cache")) is None  # 1 was read last, so 2 was the oldest
    kept.keep(("spec", 4, "cache"), _data(100))  # more than the budget alone: not kept
    assert kept.get(("spec", 4, "cache")) is None
    assert kept.get(("spec", 1, "cache")) is not None and kept.bytes == 2 * one


def test_a_packed_node_keeps_its_clients_partitions(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    from flwr.app import Context, RecordDict

    from client.dispatch import answer_node

    cfg = {**run_config, "simulation-nodes": 1}
    context = Context(
        run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 1},
        state=RecordDict(), run_config=dict(cfg),
    )  # fmt: skip
    saved = client_env._resident
    client_env._resident = None
    try:
        env = ClientEnv.from_context(context)
        answer_node(protocol.HELLO, protocol.instruction(0, protocol.HELLO), env)
        kept = client_env._resident
        assert kept is not None and kept.most_bytes == client_env.SIMULATION_DATA_BYTES
        assert len(kept._kept) == 3  # every client the node hosts
        again = ClientEnv.from_context(context).for_client(2)
        assert again.data is env.for_client(2).data
    finally:
        client_env._resident = saved
