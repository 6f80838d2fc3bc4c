"""SCAFFOLD on the engine, in-process (digits, MLP): the client half takes exactly the corrected
steps of models.scaffold, the server's c stays the mean of the clients' stored c_i, a resumed
run ends where an uninterrupted one does, and a bad control-variate reply is skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, RecordDict

from client import scaffold as client_scaffold
from client.app import app as client_app
from client.common import new_model, split_tensors
from client.env import ClientEnv
from client.state import StateStore
from models.losses import per_sample_loss
from models.scaffold import Arrays, control_update, local_steps, norm
from models.weights import get_weights, set_weights
from pollen.core import protocol
from pollen.core.contracts.scaffold import CONTROL, CONTROL_DELTA, STORED_PREFIX
from pollen.core.rundir import read_jsonl
from server.engine import Engine
from server.results import ResultsWriter
from strategies.classifier import parameter_keys
from strategies.scaffold import Scaffold
from tests.fakes import FakeClock, FakeGrid, settings_of
from tests.server.test_bad_replies import TOL, _run, _settings


def _engine_run(cfg: dict[str, Any], nodes: int, fault: Any = None) -> tuple[Scaffold, FakeGrid]:
    grid = FakeGrid(client_app, nodes, cfg)
    if fault is not None:
        grid.faults.append(fault)
    clock = FakeClock()
    strategy = Scaffold(cfg)
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    return strategy, grid


def _client_state(cfg: dict[str, Any], cid: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    store = StateStore(
        Path(cfg["out-dir"]) / "client-state" / str(cfg["run-name"]) / f"client-{cid}"
    )
    saved = store.load(before_round=10**6)
    assert saved is not None, f"client {cid} stored no state"
    return saved


def _controls(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        k.removeprefix(STORED_PREFIX): v for k, v in arrays.items() if k.startswith(STORED_PREFIX)
    }


@pytest.mark.parametrize("budget", [{"local-epochs": 3}, {"local-epochs": 1, "local-steps": 3}])
def test_the_client_takes_the_corrected_steps_and_updates_its_control_variate(
    run_config: dict[str, Any], tmp_path: Path, budget: dict[str, int]
) -> None:
    """Full-batch local training (batch-size above the split): the client's K = 3 steps (three
    epochs, or a budget of three steps) are models.scaffold.local_steps with the exact
    gradient, and its delta_c is control_update's, starting from the c_i it had stored."""
    settings = {**run_config, "algorithm": "scaffold", "batch-size": 10_000, **budget}
    env = ClientEnv(1, settings, tmp_path, "run", Path(str(settings["cache-dir"])), None)
    model = new_model(env)
    x = get_weights(model)
    rng = np.random.default_rng(0)
    keys = [k for k, p in model.named_parameters() if p.requires_grad]
    c = {k: (0.05 * rng.standard_normal(x[k].shape)).astype(np.float32) for k in keys}
    c_i = {k: (0.05 * rng.standard_normal(x[k].shape)).astype(np.float32) for k in keys}
    env.state.save(4, {STORED_PREFIX + k: v for k, v in c_i.items()}, {"round": 4})

    content = protocol.instruction(5, "train", {"lr": 0.1}, arrays=x, **{CONTROL: c})
    reply = client_scaffold.train(content, env)

    data = split_tensors(env, "train")

    def grad(y: Arrays) -> dict[str, np.ndarray]:
        probe = new_model(env)
        set_weights(probe, {k: np.asarray(v, np.float32) for k, v in y.items()})
        probe.zero_grad()
        per_sample_loss(probe(data.x), data.y, data.class_weights).mean().backward()
        grads = {}
        for k, p in probe.named_parameters():
            assert p.grad is not None
            grads[k] = p.grad.numpy().astype(np.float64)
        return {k: grads.get(k, np.zeros_like(v, np.float64)) for k, v in y.items()}

    x64 = {k: v.astype(np.float64) for k, v in x.items()}
    y_ref = local_steps(x64, grad, c_i, c, 0.1, 3)
    delta_y = protocol.arrays_of(reply)
    for k, v in x.items():
        np.testing.assert_allclose(v + delta_y[k], y_ref[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert protocol.metrics_of(reply)["local-steps"] == 3

    y = {k: x[k] + delta_y[k] for k in x}
    c_new = control_update(c_i, c, x, y, 3, 0.1)
    delta_c = protocol.arrays_of(reply, CONTROL_DELTA)
    assert set(delta_c) == set(keys)
    for k in keys:
        np.testing.assert_allclose(c_i[k] + delta_c[k], c_new[k], rtol=1e-5, atol=1e-6)
    stored, meta = env.state.load(before_round=6)  # type: ignore[misc]
    assert meta["round"] == 5
    for k in keys:
        np.testing.assert_allclose(stored[STORED_PREFIX + k], c_new[k], rtol=1e-6, atol=1e-7)


def test_scaffold_trains_and_keeps_c_the_mean_of_every_client_s_c_i(
    run_config: dict[str, Any],
) -> None:
    """4 clients, 2 sampled per round: c = (1/N) sum_i c_i over all 4 (never-sampled ones
    count with c_i = 0), each trained client stored its c_i of its last sampled round."""
    cfg = settings_of({
        **run_config, "algorithm": "scaffold", "num-clients": 4, "num-rounds": 4,
        "fraction-train": 0.5, "partitioner": "label-groups",
    })  # fmt: skip
    strategy, grid = _engine_run(cfg, nodes=4)
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert all(r["train"]["clients"] == 2.0 for r in rows)
    assert rows[-1]["train"]["server-control-norm"] > 0 and norm(strategy.control) > 0
    assert set(strategy.control) == set(parameter_keys(cfg))
    assert rows[-1]["train"]["test-accuracy"] > rows[0]["train"]["test-accuracy"] + 0.2

    trained: dict[int, list[int]] = {}  # client -> the rounds it was sampled in
    train_nodes = [node for node, kind in grid.sent if kind == "train"]
    assert len(train_nodes) == 8
    for i, node in enumerate(train_nodes):
        trained.setdefault(node - 100, []).append(i // 2 + 1)
    controls = []
    for cid in range(4):
        if cid not in trained:
            controls.append({k: np.zeros_like(v) for k, v in strategy.control.items()})
            continue
        arrays, meta = _client_state(cfg, cid)
        assert meta["round"] == trained[cid][-1]
        mine = _controls(arrays)
        assert set(mine) == set(strategy.control) and norm(mine) > 0
        controls.append(mine)
    for key, value in strategy.control.items():
        mean = np.mean([c[key] for c in controls], axis=0)
        np.testing.assert_allclose(value, mean, rtol=1e-5, atol=1e-6, err_msg=key)


def test_a_client_s_control_variate_moves_every_round(run_config: dict[str, Any]) -> None:
    cfg = settings_of({**run_config, "algorithm": "scaffold", "num-rounds": 2, "final-eval": False})
    _engine_run(cfg, nodes=3)
    for cid in range(3):
        directory = Path(cfg["out-dir"]) / "client-state" / "test" / f"client-{cid}"
        store = StateStore(directory)
        first, second = store.load(before_round=2), store.load(before_round=3)
        assert first is not None and second is not None
        assert (first[1]["round"], second[1]["round"]) == (1, 2)
        assert any(
            not np.allclose(first[0][k], second[0][k])
            for k in first[0]
            if k.startswith(STORED_PREFIX)
        )


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(run_config: dict[str, Any]) -> None:
    def settings(tag: str, **extra: Any) -> dict[str, Any]:
        cfg = _settings(run_config, "scaffold", tag)
        return {**cfg, "num-rounds": 3, "final-eval": False, **extra}

    whole, _ = _run(settings("whole"), lambda *_: None)
    _run(settings("part", **{"num-rounds": 1}), lambda *_: None)
    resumed, summary = _run(settings("part", resume=True), lambda *_: None)
    assert summary["status"] == "completed"
    rows = read_jsonl(Path(settings("part")["out-dir"]) / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3]
    arrays, meta = resumed.strategy.state()
    ref_arrays, ref_meta = whole.strategy.state()
    assert meta == ref_meta and set(arrays) == set(ref_arrays)
    assert any(k.startswith(f"{CONTROL}/") for k in arrays)  # c is in the checkpoint
    for key, value in ref_arrays.items():
        np.testing.assert_allclose(arrays[key], value, rtol=TOL, atol=TOL, err_msg=key)
    for cid in range(3):  # and every client ends with the same c_i
        mine, ref = _client_state(settings("part"), cid), _client_state(settings("whole"), cid)
        assert mine[1]["round"] == ref[1]["round"] == 3
        for key, value in ref[0].items():
            np.testing.assert_allclose(mine[0][key], value, rtol=TOL, atol=TOL, err_msg=key)


@pytest.mark.parametrize(("kind", "reason"), [("nan", "NaN or Inf"), ("shape", "shape")])
def test_a_bad_control_delta_is_skipped_with_its_reason(
    run_config: dict[str, Any], kind: str, reason: str
) -> None:
    """Client 0's delta_c is spoilt in round 1: the reply is skipped with the reason, and the
    server ends where a run that never received that reply ends."""

    def spoil(content: RecordDict) -> RecordDict:
        deltas = protocol.arrays_of(content, CONTROL_DELTA)
        key = sorted(deltas)[0]
        arr = deltas[key].copy()
        if kind == "nan":
            arr.flat[0] = np.nan
        else:
            arr = arr.ravel()[:-1]
        deltas[key] = arr
        content[CONTROL_DELTA] = protocol.to_record(deltas)
        return content

    def first_train_of_client_0(node: int, msg: Message) -> bool:
        return node == 100 and msg.metadata.message_type == "train" and msg.metadata.group_id == "1"

    # one round: the spoilt client trained and kept its c_i+, the dropped one did not, so a
    # later round would differ (see docs/algorithms/scaffold.md, lost replies)
    base = {**run_config, "algorithm": "scaffold", "num-rounds": 1, "final-eval": False}
    bad_cfg = settings_of({**base, "out-dir": f"{run_config['out-dir']}-{kind}", "run-name": kind})
    ref_cfg = settings_of({**base, "out-dir": f"{run_config['out-dir']}-drop", "run-name": "drop"})
    bad, _ = _engine_run(
        bad_cfg, 3, lambda node, msg, _: spoil if first_train_of_client_0(node, msg) else None
    )
    ref, _ = _engine_run(
        ref_cfg, 3, lambda node, msg, _: "drop" if first_train_of_client_0(node, msg) else None
    )
    rows = read_jsonl(Path(bad_cfg["out-dir"]) / "metrics.jsonl")
    failed = next(p["failed"] for p in rows[0]["phases"] if p["phase"] == "train")
    assert failed["0"].startswith("invalid reply") and reason in failed["0"]
    assert CONTROL_DELTA in failed["0"]
    assert rows[0]["train"]["clients"] == 2.0
    for ours, theirs in ((bad.weights, ref.weights), (bad.control, ref.control)):
        for key, value in theirs.items():
            np.testing.assert_allclose(ours[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
