"""End to end: a deployed federation over gRPC in which one SuperNode's device is thirty times
slower (heterogeneity.profile=tiers on the wall clock: its client waits out its device's time
before answering); with round.deadline the first round closes at the deadline without it,
and the second does not send it another instruction while it still works on the first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pollen.core.pacing import devices
from pollen.core.rundir import read_jsonl
from tests.pollen.test_cli_e2e import _pollen

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DEADLINE = 30.0
LATENCY_MS = 1000.0
SLOWDOWN = 30.0
"""A fast device's latency costs 2 s a message (1 s each way); the slow one's, 60 s."""


def test_a_deadline_holds_the_round_against_a_slow_node(
    tmp_path: Path, shared_cache: Path
) -> None:
    out = tmp_path / "paced"
    sets = {
        "heterogeneity.profile": "tiers", "heterogeneity.slow-fraction": 0.34,
        "heterogeneity.latency-ms": LATENCY_MS, "heterogeneity.slowdown": SLOWDOWN,
        "round.deadline": DEADLINE,
        "final-eval": "false", "poll-interval": 0.5, "lr": 0.1,
    }  # fmt: skip
    options = [f"--set={k}={v}" for k, v in sets.items()]
    done = _pollen(
        "deploy --algorithm fedavg --dataset digits --clients 3 --rounds 2",
        *options, "--out", str(out), cache=shared_cache,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    config = json.loads((out / "config.json").read_text())
    (slow,) = [c for c, d in enumerate(devices(config, 3, int(config["seed"])))
               if d.latency_ms > LATENCY_MS]  # fmt: skip
    first, second = read_jsonl(out / "metrics.jsonl")
    for row in (first, second):
        (train,) = [p for p in row["phases"] if p["phase"] == "train"]
        assert train["late"] == [slow] and train["valid"] == 2, train
        assert train["seconds"] < 2 * LATENCY_MS / 1e3 * SLOWDOWN * 0.6
        if row is first:  # closed at the deadline, long before the slow device's 60 s latency
            assert DEADLINE <= train["closed-at"] < DEADLINE + 3.0, train
        else:  # its round-1 work still under way: not sent another, and not waited for
            assert train["closed-at"] < DEADLINE, train
            assert "still at work on round 1's train" in train["failed"][str(slow)], train
    assert "1 late" in done.stdout


def test_buffered_aggregation_over_grpc(tmp_path: Path, shared_cache: Path) -> None:
    """FedBuff deployed: three SuperNodes kept busy, a model version every two replies."""
    out = tmp_path / "fedbuff"
    done = _pollen(
        "deploy --algorithm fedavg --dataset digits --clients 3 --rounds 3 "
        "--set async.buffer=2 --set async.concurrency=3 --set poll-interval=0.5 --set lr=0.1",
        "--out", str(out), cache=shared_cache,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3]
    for row in rows:
        (train,) = [p for p in row["phases"] if p["phase"] == "train"]
        assert train["valid"] == 2 and "staleness-mean" in row["train"]
    assert rows[-1]["time"] > rows[0]["time"]
    assert summary["final"]["eval"]["test-accuracy"] > 0.3
