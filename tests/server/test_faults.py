"""Faults around the clients, in-process: a node that crashes and restarts under a new node id
while Flower still lists the old one, and a client whose state file on disk is damaged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from flwr.app import Message

from client.app import app as client_app
from client.state import StateStore
from server.engine import Engine
from server.results import ResultsWriter, read_jsonl
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
    assert [t for n, t in grid.sent if n == 102] == ["query.hello", "train", "train"]
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
