"""The round engine driven in-process: a real ServerApp/ClientApp pair over a fake Grid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict

from client.app import app as client_app
from pollen.core import protocol
from pollen.core.rundir import read_jsonl
from server import checkpoint
from server.app import app as server_app
from server.engine import Engine, PhaseFailed
from server.results import ResultsWriter
from strategies.base import Federation, Strategy
from strategies.fedavg import FedAvg
from strategies.local import LocalOnly
from tests.fakes import FakeClock, FakeGrid, settings_of


def _run_server_app(grid: FakeGrid, cfg: dict[str, Any]) -> None:
    server_app(
        grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=dict(cfg))
    )


def _engine(
    grid: FakeGrid,
    cfg: dict[str, Any],
    strategy: Strategy | None = None,
    clock: FakeClock | None = None,
) -> Engine:
    clock = clock or FakeClock()
    return Engine(
        grid,
        cfg,
        strategy or FedAvg(cfg),
        ResultsWriter(cfg["out-dir"]),
        clock=clock,
        sleep=clock.sleep,
    )


def test_fedavg_run_learns_and_writes_results(run_config: dict[str, Any]) -> None:
    grid = FakeGrid(client_app, 3, run_config)
    _run_server_app(grid, run_config)
    out = Path(run_config["out-dir"])
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3]
    # round r's client test accuracy is that of the model received in round r
    first, last = rows[0]["train"]["test-accuracy"], rows[-1]["train"]["test-accuracy"]
    assert first < 0.3 < 0.7 < last
    assert rows[-1]["server-eval"]["test-accuracy"] > 0.8
    # every round encoded and decoded weights; every phase's push is timed apart
    assert all(r["codec-seconds"] > 0 for r in rows)
    assert all("push-seconds" in p for r in rows for p in r["phases"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["final"]["eval"]["test-accuracy"] > 0.8
    assert (out / "final_model.npz").exists() and (out / "checkpoint" / "state.npz").exists()
    types = [t for _, t in grid.sent]
    assert types.count("query.hello") == 3
    assert types.count("train") == 9 and types.count("evaluate") == 3
    clients = read_jsonl(out / "clients.jsonl")
    assert {(c["round"], c["client-id"]) for c in clients if c["phase"] == "train"} == {
        (r, c) for r in (1, 2, 3) for c in (0, 1, 2)
    }


class EchoPerClient(Strategy):
    """Sends every client its own array through the no-op handler and checks the echo."""

    def initialize(self, seed: int) -> None:
        self.seen: dict[int, float] = {}

    def run_round(self, fed: Federation) -> dict[str, float]:
        payloads = {
            c.cid: protocol.instruction(
                fed.server_round,
                "query.noop",
                arrays={"x": np.full(3, 10.0 * c.cid + fed.server_round)},
            )
            for c in fed.available()
        }
        for cid, content in fed.exchange("query.noop", payloads).items():
            self.seen[cid] = float(protocol.arrays_of(content)["x"][0])
        return {}


def test_each_client_gets_its_own_content(run_config: dict[str, Any]) -> None:
    cfg = settings_of({**run_config, "algorithm": "noop", "num-rounds": 2})
    strategy = EchoPerClient(cfg)
    grid = FakeGrid(client_app, 3, cfg)
    _engine(grid, cfg, strategy).run()
    assert strategy.seen == {0: 2.0, 1: 12.0, 2: 22.0}


class ReversedGrid(FakeGrid):
    """Delivers each poll's replies in the reverse of the order asked for."""

    def pull_messages(self, message_ids: Any) -> list[Message]:
        return list(reversed(list(super().pull_messages(message_ids))))


class OrderRecorder(Strategy):
    """Records the order in which a phase's replies reach the strategy."""

    def initialize(self, seed: int) -> None:
        self.orders: list[list[int]] = []

    def run_round(self, fed: Federation) -> dict[str, float]:
        payloads = {
            c.cid: protocol.instruction(fed.server_round, "query.noop", arrays={"x": np.zeros(1)})
            for c in fed.available()
        }
        self.orders.append(list(fed.exchange("query.noop", payloads)))
        return {}


def test_replies_reach_the_strategy_in_client_order(run_config: dict[str, Any]) -> None:
    """Whatever order replies arrive in, strategies get them by client id, so their sums (and
    the trained weights) do not depend on arrival order."""
    cfg = settings_of({**run_config, "algorithm": "noop", "num-rounds": 2, "num-clients": 4})
    strategy = OrderRecorder(cfg)
    _engine(ReversedGrid(client_app, 4, cfg), cfg, strategy).run()
    assert strategy.orders == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_sampling_takes_the_configured_fraction_reproducibly(run_config: dict[str, Any]) -> None:
    cfg = settings_of(
        {
            **run_config,
            "algorithm": "noop",
            "num-clients": 5,
            "num-rounds": 6,
            "fraction-train": 0.4,
        }
    )

    def sampled_per_round() -> list[list[int]]:
        grid = FakeGrid(client_app, 5, cfg)
        _engine(grid, cfg, strategy=_noop(cfg)).run()
        rows = read_jsonl(Path(cfg["out-dir"]) / "clients.jsonl")
        return [sorted(r["client-id"] for r in rows if r["round"] == k) for k in range(1, 7)]

    first = sampled_per_round()
    Path(cfg["out-dir"], "clients.jsonl").unlink()
    assert all(len(s) == 2 for s in first)
    assert len({tuple(s) for s in first}) > 1
    assert sampled_per_round() == first


def _noop(cfg: dict[str, Any]) -> Strategy:
    from strategies.noop import NoOp

    return NoOp(cfg)


def test_silent_client_times_out_and_round_completes(run_config: dict[str, Any]) -> None:
    grid = FakeGrid(client_app, 3, run_config)
    grid.faults.append(
        lambda node, msg, _: (
            "drop" if node == 101 and msg.metadata.message_type == "train" else None
        )
    )
    clock = FakeClock()
    summary = _engine(grid, run_config, clock=clock).run()
    assert summary["status"] == "completed"
    rows = read_jsonl(Path(run_config["out-dir"]) / "metrics.jsonl")
    for row in rows:
        train = row["phases"][-1]
        assert train["valid"] == 2 and "no reply within" in train["failed"]["1"]
        assert row["train"]["clients"] == 2.0
    assert clock.now >= 3 * run_config["phase-timeout"]
    # events.jsonl, which `pollen` follows live (docs/monitoring.md): each round and the final
    # evaluation announce themselves; a phase's progress names the clients it still waits for
    # once few are left (the straggler), never a node id of the hello
    events = read_jsonl(Path(run_config["out-dir"]) / "events.jsonl")
    kinds = [e["event"] for e in events]
    starts = [(e["event"], e["round"]) for e in events if e["event"].endswith("-start")]
    assert [s for s in starts if s[0] != "phase-start"] == [
        ("round-start", 1), ("server-eval-start", 1), ("round-start", 2),
        ("server-eval-start", 2), ("round-start", 3), ("server-eval-start", 3),
        ("final-start", 4), ("server-eval-start", 4),
    ]  # fmt: skip
    assert kinds.index("clients") < kinds.index("round-start")
    train = [e for e in events if e["event"] == "phase-progress" and e["phase"] == "train"]
    for rnd in (1, 2, 3):
        (progress,) = [e for e in train if e["round"] == rnd]  # all but one answered at once
        assert progress["answered"] == progress["valid"] == 2 and progress["total"] == 3
        assert progress["waiting"] == [1]  # the silent client, until the phase times out
    hello = [e for e in events if e["event"] == "phase-progress" and e["phase"] == "query.hello"]
    assert hello and all("waiting" not in e for e in hello)


def test_error_reply_drops_the_client_until_it_greets_again(run_config: dict[str, Any]) -> None:
    grid = FakeGrid(client_app, 3, run_config)
    failures = {"left": 1}

    def fail_once(node: int, msg: Message, _: Any) -> Any:
        if node == 102 and msg.metadata.message_type == "train" and failures["left"]:
            failures["left"] -= 1
            return "error"
        return None

    grid.faults.append(fail_once)
    _engine(grid, run_config).run()
    rows = read_jsonl(Path(run_config["out-dir"]) / "metrics.jsonl")
    assert "error reply" in rows[0]["phases"][-1]["failed"]["2"]
    # greeted again in round 2 and trained from then on
    assert [p["phase"] for p in rows[1]["phases"]] == ["query.hello", "train"]
    assert rows[1]["train"]["clients"] == 3.0
    assert [n for n, t in grid.sent if t == "query.hello"].count(102) == 2


def _corrupt(kind: str) -> Any:
    def change(content: RecordDict) -> RecordDict:
        values = protocol.from_record(content[protocol.ARRAYS])  # type: ignore[arg-type]
        first = next(iter(values))
        if kind == "nan":
            values[first] = values[first].copy()
            values[first].flat[0] = np.nan
        elif kind == "shape":
            values[first] = values[first][:-1]
        elif kind == "dtype":
            values[first] = values[first].astype(np.float64)
        elif kind == "missing-key":
            del values[first]
        elif kind == "extra-key":
            values["extra"] = np.zeros(2, np.float32)
        out = RecordDict({k: v for k, v in content.items() if k != protocol.ARRAYS})
        out[protocol.ARRAYS] = protocol.to_record(values)
        if kind == "examples":
            out[protocol.METRICS]["num-examples"] = 10**12  # type: ignore[index,assignment]
        if kind == "round":
            out[protocol.ENVELOPE]["round"] = 99  # type: ignore[index,assignment]
        if kind == "no-metrics":
            del out[protocol.METRICS]
        if kind == "inf-metric":
            out[protocol.METRICS]["train-loss"] = float("inf")  # type: ignore[index,assignment]
        return out

    return change


@pytest.mark.parametrize(
    "kind",
    [
        "nan",
        "shape",
        "dtype",
        "missing-key",
        "extra-key",
        "examples",
        "round",
        "no-metrics",
        "inf-metric",
    ],
)
def test_bad_reply_is_skipped_and_never_aggregated(run_config: dict[str, Any], kind: str) -> None:
    cfg = settings_of({**run_config, "num-rounds": 1, "final-eval": False, "server-eval": False})
    # what the two honest clients alone produce
    honest = FakeGrid(client_app, 3, cfg)
    honest.faults.append(
        lambda node, msg, _: (
            "drop" if node == 100 and msg.metadata.message_type == "train" else None
        )
    )
    clean = FedAvg(cfg)
    _engine(honest, cfg, clean).run()

    cfg2 = settings_of({**cfg, "out-dir": cfg["out-dir"] + "-bad"})
    grid = FakeGrid(client_app, 3, cfg2)
    grid.faults.append(
        lambda node, msg, _: (
            _corrupt(kind) if node == 100 and msg.metadata.message_type == "train" else None
        )
    )
    strategy = FedAvg(cfg2)
    _engine(grid, cfg2, strategy).run()
    row = read_jsonl(Path(cfg2["out-dir"]) / "metrics.jsonl")[0]
    assert "invalid reply" in row["phases"][-1]["failed"]["0"]
    for key, value in clean.weights.items():
        np.testing.assert_array_equal(strategy.weights[key], value)


def test_too_few_replies_stop_the_run_with_a_reason(run_config: dict[str, Any]) -> None:
    cfg = settings_of({**run_config, "min-replies": 3})
    grid = FakeGrid(client_app, 3, cfg)
    grid.faults.append(
        lambda node, msg, _: (
            "error" if node == 100 and msg.metadata.message_type == "train" else None
        )
    )
    with pytest.raises(PhaseFailed, match="2 valid replies of 3, at least 3 needed"):
        _engine(grid, cfg).run()
    summary = json.loads(Path(cfg["out-dir"], "summary.json").read_text())
    assert summary["status"] == "failed" and "at least 3 needed" in summary["reason"]


def test_waiting_for_clients_gives_up_clearly(run_config: dict[str, Any]) -> None:
    cfg = settings_of({**run_config, "min-available-clients": 3})
    grid = FakeGrid(client_app, 2, {**cfg, "num-clients": 3})
    for ctx in grid.contexts.values():
        ctx.node_config["num-partitions"] = 3
    with pytest.raises(PhaseFailed, match="only 2 of the 3 required clients"):
        _engine(grid, cfg).run()
    events = read_jsonl(Path(cfg["out-dir"]) / "events.jsonl")
    waits = [e for e in events if e["event"] == "waiting-for-clients"]
    assert len(waits) == 1  # said once: the count did not change while it waited
    assert waits[0]["connected"] == 2 and waits[0]["needed"] == 3
    assert waits[0]["timeout"] == cfg["wait-for-clients"]


@pytest.mark.parametrize("algorithm", ["fedavg", "local"])
def test_resume_equals_uninterrupted_run(run_config: dict[str, Any], algorithm: str) -> None:
    whole = settings_of(
        {
            **run_config,
            "algorithm": algorithm,
            "out-dir": run_config["out-dir"] + "-a",
            "run-name": "a",
        }
    )
    _run_server_app(FakeGrid(client_app, 3, whole), whole)

    part = settings_of(
        {**whole, "out-dir": run_config["out-dir"] + "-b", "run-name": "b", "num-rounds": 2}
    )
    _run_server_app(FakeGrid(client_app, 3, part), part)
    # the client answered round 3 before the server stopped: resume must not see that state
    resumed = settings_of({**part, "num-rounds": 3, "resume": True})
    _run_server_app(FakeGrid(client_app, 3, resumed), resumed)

    a = read_jsonl(Path(whole["out-dir"]) / "metrics.jsonl")
    b = read_jsonl(Path(resumed["out-dir"]) / "metrics.jsonl")
    assert [r["round"] for r in b] == [1, 2, 3]
    # float32 kernels may round differently with memory alignment: equal to 1e-6, not bitwise
    for ra, rb in zip(a, b, strict=True):
        assert rb["train"] == pytest.approx(ra["train"], rel=1e-6)
    sa = json.loads(Path(whole["out-dir"], "summary.json").read_text())
    sb = json.loads(Path(resumed["out-dir"], "summary.json").read_text())
    assert sb["final"]["eval"] == pytest.approx(sa["final"]["eval"], rel=1e-6)


def test_resume_refuses_changed_settings_and_corrupt_checkpoints(
    run_config: dict[str, Any],
) -> None:
    cfg = settings_of({**run_config, "num-rounds": 1})
    _run_server_app(FakeGrid(client_app, 3, cfg), cfg)
    changed = settings_of({**cfg, "lr": 0.5, "resume": True, "num-rounds": 2})
    with pytest.raises(checkpoint.CheckpointError, match="lr"):
        _run_server_app(FakeGrid(client_app, 3, changed), changed)
    npz = Path(cfg["out-dir"], "checkpoint", "state.npz")
    npz.write_bytes(npz.read_bytes()[:100])
    again = settings_of({**cfg, "resume": True, "num-rounds": 2})
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        _run_server_app(FakeGrid(client_app, 3, again), again)
    assert npz.stat().st_size == 100  # nothing overwritten


def test_local_only_keeps_personal_models_on_disk(run_config: dict[str, Any]) -> None:
    cfg = settings_of({**run_config, "algorithm": "local"})
    strategy = LocalOnly(cfg)
    _engine(FakeGrid(client_app, 3, cfg), cfg, strategy).run()
    state_dir = Path(cfg["out-dir"]) / "client-state" / "test"
    assert sorted(p.name for p in state_dir.iterdir()) == ["client-0", "client-1", "client-2"]
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert rows[-1]["train"]["test-accuracy"] > rows[0]["train"]["test-accuracy"]


def test_fedavg_trains_the_cnn_too(run_config: dict[str, Any]) -> None:
    cfg = settings_of({**run_config, "model": "cnn", "num-rounds": 2, "lr": 0.05})
    strategy = FedAvg(cfg)
    _engine(FakeGrid(client_app, 3, cfg), cfg, strategy).run()
    assert any(w.ndim == 4 for w in strategy.weights.values())  # conv kernels
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert rows[-1]["server-eval"]["test-accuracy"] > rows[0]["train"]["test-accuracy"]
