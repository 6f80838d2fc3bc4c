"""Secure aggregation on real processes: `pollen deploy` of four SuperNodes over gRPC with TLS and
SuperNode authentication, one SuperNode killed in the middle of a round's secure sum; the
round completes with the others, the run completes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pollen.core.contracts import secagg as contract
from pollen.core.rundir import read_jsonl
from tests.pollen.test_cli_e2e import POLLEN, _processes_under
from tests.pollen.test_faults_e2e import TIMEOUT, _wait
from tests.pollen.test_node_auth_e2e import _certs
from tests.pollen.test_operations_e2e import _env, _supernode_pid

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _ended(out: Path, rnd: int, phase: str) -> bool:
    return any(
        e.get("event") == "phase-end" and e.get("round") == rnd and e.get("phase") == phase
        for e in read_jsonl(out / "events.jsonl")
    )


def test_deploy_with_a_supernode_killed_after_the_key_sharing_completes(
    tmp_path: Path, shared_cache: Path
) -> None:
    certs = _certs(tmp_path / "certs", "--nodes", "4")
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*POLLEN, "deploy", "--algorithm", "fedavg", "--dataset", "digits", "--clients", "4",
         "--rounds", "2", "--out", str(out), "--tls-dir", str(certs), "--auth",
         "--set", "secagg.enabled=true", "--set", f"phase-timeout={2 * TIMEOUT}",
         "--set", "poll-interval=0.5", "--set", "lr=0.1"],
        env=_env(shared_cache, tmp_path / "home"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _wait("round 1's key sharing", lambda: _ended(out, 1, contract.SHARES))
        os.kill(_supernode_pid(out, 2), signal.SIGKILL)
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output[-4000:]
    assert "with TLS and node authentication" in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["secure-aggregation"]["protocol"] == "SecAgg+"
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2]
    phases = {p["phase"]: p for p in rows[0]["phases"]}
    # client 2 shared its keys, then was lost: in the masked phase (its neighbours' masks with it
    # removed) or, had its masked input arrived first, in the unmasking (its self mask rebuilt)
    assert phases[contract.SHARES]["valid"] == 4
    lost = {**phases["train"]["failed"], **phases[contract.UNMASK]["failed"]}
    assert "2" in lost
    assert phases[contract.UNMASK]["valid"] >= 3  # t of the complete graph of four
    assert rows[0]["train"]["clients"] in (3.0, 4.0)
    # round 2 trained from round 1's secure sum (its test accuracy: of the model it received)
    assert rows[1]["train"]["test-accuracy"] > rows[0]["train"]["test-accuracy"] + 0.2
    time.sleep(1.0)
    assert _processes_under(out) == []
