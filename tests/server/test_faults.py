"""Faults around the clients, in-process: a node that crashes and restarts under a new node id
while Flower still lists the old one, and a client whose state file on disk is damaged."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message

from client.app import app as client_app
from client.state import StateStore
from pollen.core.rundir import read_jsonl
from server.engine import Engine, PhaseFailed
from server.results import ResultsWriter
from strategies.fedavg import FedAvg
from strategies.fedem import FedEM
from strategies.local import LocalOnly
from tests.fakes import FakeClock, FakeGrid, settings_of


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def test_a_restarted_node_takes_over_from_its_silent_predecessor(
    run_config: dict[str, Any],
) -> None:
    cfg = settings_of({**run_config, "algorithm": "fedem", "fedem.components": 2,
                       "final-eval": False, "server-eval": False})  # fmt: skip
    grid = FakeGrid(client_app, 3, cfg)
    state_dir = Path(cfg["out-dir"]) / "client-state" / "test" / "client-2"
    at_crash: dict[str, str] = {}

    def crash_in_round_2(node: int, msg: Message, _: Any) -> str | None:
        """Node 102 dies at round 2's train (still listed online); node 202 starts for it."""
        if node != 102 or msg.metadata.group_id == "1":
            return None
        if 202 not in grid.contexts:
            at_crash.update(_digests(state_dir))
            grid.add_node(202, 2, 3, {})
        return "drop"

    grid.faults.append(crash_in_round_2)
    clock = FakeClock()
    summary = Engine(
        grid, cfg, FedEM(cfg), ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep
    ).run()
    assert summary["status"] == "completed"
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert [r["train"]["clients"] for r in rows] == [3.0, 2.0, 3.0]
    assert rows[1]["phases"][-1]["failed"] == {"2": "no reply within 30 s"}
    # round 3 greeted the new node only, and client 2 trained there
    assert [p["phase"] for p in rows[2]["phases"]] == ["query.hello", "train"]
    assert (202, "train") in grid.sent
    # round 2's train instruction was sent again (resend-limit times) before the phase gave up
    resent = ["train"] * int(cfg["resend-limit"])
    assert [t for n, t in grid.sent if n == 102] == ["query.hello", "train", "train", *resent]
    # the restarted client went on from the state it had written before the crash
    assert at_crash == {"state-000001.npz": at_crash["state-000001.npz"]}
    saved = StateStore(state_dir).load(before_round=4)
    assert saved is not None and saved[1]["round"] == 3
    assert _digests(state_dir)["state-000001.npz"] == at_crash["state-000001.npz"]


def test_a_damaged_client_state_file_is_reported_and_never_overwritten(
    run_config: dict[str, Any],
) -> None:
    cfg = settings_of({**run_config, "algorithm": "local", "num-rounds": 2})
    Engine(FakeGrid(client_app, 3, cfg), cfg, LocalOnly(cfg), ResultsWriter(cfg["out-dir"])).run()
    state_dir = Path(cfg["out-dir"]) / "client-state" / "test" / "client-0"
    damaged = state_dir / "state-000002.npz"
    damaged.write_bytes(damaged.read_bytes()[:200])
    before = _digests(state_dir)

    resumed = settings_of({**cfg, "num-rounds": 3, "resume": True})
    grid = FakeGrid(client_app, 3, resumed)
    grid.errors_as_replies = True
    summary = Engine(grid, resumed, LocalOnly(resumed), ResultsWriter(cfg["out-dir"])).run()
    assert summary["status"] == "completed"  # the others go on
    row = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[-1]
    assert row["round"] == 3 and row["train"]["clients"] == 2.0
    reason = row["phases"][-1]["failed"]["0"]
    assert "StateError" in reason and "state-000002.npz" in reason and "unreadable" in reason
    assert _digests(state_dir) == before  # nothing replaced, nothing added
    written = json.loads(Path(cfg["out-dir"], "summary.json").read_text())
    assert written["final"]["eval"]["clients"] == 2.0


def test_of_two_live_nodes_claiming_one_client_the_first_keeps_it(
    run_config: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Node 201 claims client 1 from the start, node 202 claims client 2 from round 2, while
    101 and 102 answer: both are refused once and never greeted again while the holder answers.
    When 102 goes silent (round 3), 202 takes client 2 over. Every client is trained and
    aggregated once: the model equals that of the same run without the second claimants."""
    cfg = settings_of({**run_config, "num-rounds": 4, "server-eval": False})

    def run(duplicates: bool) -> tuple[FakeGrid, dict[str, np.ndarray]]:
        grid = FakeGrid(client_app, 3, cfg)
        if duplicates:
            grid.add_node(201, 1, 3, {})

        def faults(node: int, msg: Message, _: Any) -> str | None:
            rnd, kind = msg.metadata.group_id, msg.metadata.message_type
            if duplicates and (node, rnd, kind) == (100, "1", "train"):
                grid.add_node(202, 2, 3, {})
            return "drop" if (node, rnd, kind) == (102, "3", "train") else None

        grid.faults.append(faults)
        clock = FakeClock()
        strategy = FedAvg(cfg)
        writer = ResultsWriter(Path(cfg["out-dir"]) / str(duplicates))
        engine = Engine(grid, cfg, strategy, writer, clock=clock, sleep=clock.sleep)
        assert engine.run()["status"] == "completed"
        return grid, dict(strategy.state()[0])

    caplog.set_level(logging.WARNING, logger="flwr.pollen")
    grid, model = run(duplicates=True)
    out = Path(cfg["out-dir"]) / "True"
    assert [r["train"]["clients"] for r in read_jsonl(out / "metrics.jsonl")] == [3, 3, 2, 3]
    sent = {node: [t for n, t in grid.sent if n == node] for node in (102, 201, 202)}
    assert sent[201] == ["query.hello"]
    assert sent[202] == ["query.hello", "query.hello", "train", "evaluate"]
    resent = ["train"] * int(cfg["resend-limit"])  # round 3's, before the phase gave up
    assert sent[102] == ["query.hello", "train", "train", "train", *resent]
    refused = [e for e in read_jsonl(out / "events.jsonl") if e["event"] == "client-refused"]
    assert [(e["round"], e["client"], e["node"], e["holder"]) for e in refused] == [
        (1, 1, 201, 101),
        (2, 2, 202, 102),
    ]
    warnings = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(warnings) == 2 and "201" in warnings[0] and "101" in warnings[0]
    _, alone = run(duplicates=False)
    assert model.keys() == alone.keys()
    for key in model:  # equal up to the order of float sums (replies arrive in any order)
        np.testing.assert_allclose(model[key], alone[key], rtol=1e-5, atol=1e-6)


def test_a_phase_waiting_thousands_of_polls_times_out_cleanly(run_config: dict[str, Any]) -> None:
    """A reply that never comes, with a long timeout and a short poll interval: the engine keeps
    polling until the phase timeout (once, waits grew as 2**polls and overflowed a float after
    1,024 polls, which crashed a deployed run waiting for a lost message)."""
    cfg = settings_of({**run_config, "num-rounds": 1, "final-eval": False, "server-eval": False,
                       "phase-timeout": 600.0, "poll-interval": 0.05})  # fmt: skip
    grid = FakeGrid(client_app, 3, cfg)
    grid.faults.append(
        lambda node, msg, _: (
            "drop" if node == 101 and msg.metadata.message_type == "train" else None
        )
    )
    clock = FakeClock()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.sleep(seconds)

    summary = Engine(
        grid, cfg, FedAvg(cfg), ResultsWriter(cfg["out-dir"]), clock=clock, sleep=sleep
    ).run()
    assert summary["status"] == "completed"
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert rows[0]["phases"][-1]["failed"] == {"1": "no reply within 600 s"}
    assert len(sleeps) > 1100 and max(sleeps) <= 0.05


def _hello_errors(times: int) -> Any:
    """A fault: every node's first `times` hellos are answered with an error."""
    seen: dict[int, int] = {}

    def fault(node: int, msg: Message, _content: Any) -> str | None:
        if msg.metadata.message_type != "query.hello":
            return None
        seen[node] = seen.get(node, 0) + 1
        return "error" if seen[node] <= times else None

    return fault


def test_nodes_that_answer_every_hello_with_an_error_stop_the_wait_at_once(
    run_config: dict[str, Any],
) -> None:
    """A ClientApp that cannot serve the run (its data cannot be loaded, say) answers every hello
    with an error: once each node has done so resend-limit + 1 times the run stops, naming the
    reason, instead of waiting out wait-for-clients."""
    cfg = settings_of({**run_config, "wait-for-clients": 600.0})
    grid = FakeGrid(client_app, 3, cfg)
    grid.error_reason = "the data function returned tuple"
    grid.faults.append(_hello_errors(10**6))
    clock = FakeClock()
    engine = Engine(grid, cfg, FedAvg(cfg), ResultsWriter(cfg["out-dir"]), clock, clock.sleep)
    why = r"can connect: 0 of 3 clients.*answered the hello with an error.*returned tuple"
    with pytest.raises(PhaseFailed, match=why):
        engine.run()
    assert clock.now < 10  # seconds of polling, not the 600 s wait
    hellos = [n for n, t in grid.sent if t == "query.hello"]
    assert len(hellos) == 3 * (int(cfg["resend-limit"]) + 1)


def test_a_node_whose_hello_fails_fewer_times_joins(run_config: dict[str, Any]) -> None:
    cfg = settings_of({**run_config, "num-rounds": 1})
    grid = FakeGrid(client_app, 3, cfg)
    grid.faults.append(_hello_errors(int(cfg["resend-limit"])))
    summary = Engine(grid, cfg, FedAvg(cfg), ResultsWriter(cfg["out-dir"])).run()
    assert summary["status"] == "completed"
    assert summary["clients"] == [0, 1, 2]
