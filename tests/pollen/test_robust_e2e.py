"""End to end: a real federation under attack. `pollen deploy` starts 5 SuperNodes over gRPC on
`digits`, the last one attacking (`--attack sign-flip`: it sends -10 x its honest update); with
the mean the model is lost, with the coordinate-wise median the run ends within 3 points of
the same federation without the attacker's misbehaviour (run in-process: the same code, data
and seeds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict

from client.app import app as client_app
from pollen.core.runconfig import resolve
from server.app import app as server_app
from server.local_grid import LocalGrid, task_identity

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETTINGS = {"lr": 0.1, "batch-size": 16, "poll-interval": 0.5}
OPTIONS = "--dataset digits --clients 5 --rounds 5"


def _deploy(out: Path, cache: Path, *extra: str) -> dict[str, Any]:
    sets = [a for k, v in SETTINGS.items() for a in ("--set", f"{k}={v}")]
    argv = [sys.executable, "-m", "pollen.tools.cli", "deploy", *OPTIONS.split(), *sets, *extra]
    env = dict(os.environ, POLLEN_CACHE_DIR=str(cache), FLWR_TELEMETRY_ENABLED="0")
    done = subprocess.run(
        [*argv, "--out", str(out)], capture_output=True, text=True, timeout=900, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    return summary


def _clean(out: Path, cache: Path) -> float:
    settings = dict(
        resolve(
            {
                "dataset": "digits", "num-clients": 5, "num-rounds": 5, **SETTINGS,
                "out-dir": str(out), "cache-dir": str(cache), "client-state-dir": str(out / "s"),
            }
        )
    )  # fmt: skip
    with task_identity():
        server_app(LocalGrid(client_app, 5, settings), Context(1, 0, {}, RecordDict(), settings))
    summary = json.loads((out / "summary.json").read_text())
    return float(summary["final"]["eval"]["test-accuracy"])


def test_one_attacking_supernode_is_survived_by_a_robust_rule(
    tmp_path: Path, shared_cache: Path
) -> None:
    clean = _clean(tmp_path / "clean", shared_cache)
    assert clean > 0.8
    mean = _deploy(tmp_path / "mean", shared_cache, "--attack", "sign-flip")
    robust = _deploy(
        tmp_path / "median", shared_cache, "--attack", "sign-flip",
        "--set", "robust.rule=median", "--set", "robust.f=1",
    )  # fmt: skip
    # the node attacked on its own (the server's settings name no attack), and said so
    assert "attack" not in mean
    assert mean["last-round"]["train"]["attacking"] == 1.0
    assert robust["robust"]["robust.rule"] == "median"
    mean_acc = mean["final"]["eval"]["test-accuracy"]
    robust_acc = robust["final"]["eval"]["test-accuracy"]
    assert mean_acc < clean - 0.3, (mean_acc, clean)
    assert robust_acc > clean - 0.03, (robust_acc, clean)
