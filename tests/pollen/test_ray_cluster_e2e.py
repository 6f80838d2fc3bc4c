"""End to end: `pollen simulate --ray-address` runs its ClientApps on an existing Ray cluster
(a head node this test starts with `ray start --head` and stops by its process group)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pollen.tools.processes import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RAY = Path(sys.executable).parent / "ray"


@pytest.fixture
def ray_cluster() -> Iterator[tuple[str, Path]]:
    """A one-node Ray cluster with 2 CPUs: (its address, its temporary directory). Its own
    --temp-dir keeps it out of /tmp/ray, so no other Ray user on this machine joins it."""
    if not RAY.exists():
        pytest.skip(f"no ray CLI at {RAY}")
    temp = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp"))  # short: Ray's socket paths
    port = free_port()
    argv = [
        str(RAY), "start", "--head", "--block", "--port", str(port), "--num-cpus", "2",
        "--num-gpus", "0", "--temp-dir", str(temp), "--include-dashboard=false",
        "--disable-usage-stats", "--ray-client-server-port", str(free_port()),
        "--dashboard-agent-listen-port", str(free_port()),
        "--dashboard-agent-grpc-port", str(free_port()),
        "--runtime-env-agent-port", str(free_port()),
        "--metrics-export-port", str(free_port()),
    ]  # fmt: skip
    env = dict(os.environ, RAY_ADDRESS="")
    with open(temp / "ray-start.log", "wb") as log:
        head = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    try:
        deadline = time.monotonic() + 120
        while not (temp / "ray_current_cluster").exists():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start failed:\n{(temp / 'ray-start.log').read_text()}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", temp
    finally:
        # every process of the cluster is in the process group of `ray start` started here
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(head.pid, sig)
            except ProcessLookupError:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                head.wait(timeout=wait)
        shutil.rmtree(temp, ignore_errors=True)


def _client_actors(temp: Path) -> list[str]:
    """The cluster's worker logs that belong to Flower's ClientApp actors."""
    logs = sorted(temp.glob("session_*/logs/worker-*.out"))
    return [p.name for p in logs if ":actor_name:ClientAppActor" in p.read_text(errors="replace")]


def test_simulate_runs_its_clients_on_an_existing_ray_cluster(
    tmp_path: Path, shared_cache: Path, ray_cluster: tuple[str, Path]
) -> None:
    address, temp = ray_cluster
    assert _client_actors(temp) == []  # nothing of Flower in the cluster before the run
    out = tmp_path / "run"
    env = dict(os.environ, POLLEN_CACHE_DIR=str(shared_cache), FLWR_TELEMETRY_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    argv = [sys.executable, "-m", "pollen.tools.cli", "simulate", "--algorithm", "fedavg",
            "--dataset", "digits", "--clients", "3", "--nodes", "2", "--rounds", "1",
            "--out", str(out), "--ray-address", address]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"on the Ray cluster at {address}" in done.stdout
    assert "3 clients on 2 simulated SuperNodes" in done.stdout
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    # the packing holds there: node 0 hosts clients 0 and 2, and all three trained
    rows = [json.loads(x) for x in (out / "clients.jsonl").read_text().splitlines()]
    assert sorted(r["client-id"] for r in rows if r["phase"] == "train") == [0, 1, 2]
    # the ClientApps ran as actors of this cluster (a run on a Ray of its own leaves none here)
    assert len(_client_actors(temp)) >= 1
