"""What only shows once Flower's processes run: a port taken between the check and the bind,
and a run whose ServerApp never starts. Each ends in one line naming the cause and a non-zero
exit, never Flower's traceback or an endless wait."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pollen.tools.processes import free_port
from tests.pollen.test_cli_e2e import POLLEN, _processes_under

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RACE = (
    "import sys; from pollen.tools import preflight; "
    "preflight.check_port_free = lambda *args: None; "  # the port is taken after the check
    "from pollen.tools.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize("which", ["--fleet-port", "--port"])
def test_a_port_taken_after_the_check_is_one_line_not_flowers_traceback(
    tmp_path: Path, taken_port: int, which: str
) -> None:
    ports = {"--port": str(free_port()), "--fleet-port": str(free_port()), which: str(taken_port)}
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [sys.executable, "-c", RACE, "server", "--insecure", "--fleet-host", "127.0.0.1",
         *[x for kv in ports.items() for x in kv]],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("pollen: error:")]
    api = "Fleet API" if which == "--fleet-port" else "HTTP API"
    assert (
        len(errors) == 1
        and f"the {api} address 127.0.0.1:{taken_port} is already in use" in errors[0]
    ), done.stderr
    assert f"choose another {which}" in errors[0]
    assert "Traceback" not in done.stdout + done.stderr


def test_a_run_whose_serverapp_never_starts_stops_after_the_start_timeout(
    tmp_path: Path, shared_cache: Path
) -> None:
    """`pollen server --isolation process` waits for a SuperExec to run the ServerApp; with none
    started, a submitted run never starts. Before: `pollen run` waited for it forever."""
    port, fleet = free_port(), free_port()
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", POLLEN_CACHE_DIR=str(shared_cache))
    server = subprocess.Popen(
        [*POLLEN, "server", "--insecure", "--isolation", "process", "--port", str(port),
         "--fleet-port", str(fleet), "--fleet-host", "127.0.0.1"],
        env=dict(env, FLWR_HOME=str(tmp_path / "link")), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    out = tmp_path / "run"
    try:
        t0 = time.monotonic()
        done = subprocess.run(
            [*POLLEN, "run", "--superlink", f"127.0.0.1:{port}", "--dataset", "digits",
             "--clients", "2", "--rounds", "1", "--out", str(out), "--start-timeout", "20",
             "--plain"],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        took = time.monotonic() - t0
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert done.returncode != 0, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("pollen: error:")]
    assert len(errors) == 1 and "within 20 s of the submission (--start-timeout)" in errors[0], (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    assert took < 200, took
    assert _processes_under(out) == []


def test_a_clients_port_taken_after_the_check_is_one_line(tmp_path: Path, taken_port: int) -> None:
    """`pollen client --port P`: the SuperNode's local Runtime API port, taken between the check
    and the SuperNode's bind. Before: uvicorn's error, then Flower's traceback ending in
    `RuntimeError: SuperNode Runtime HTTP API failed to start.`"""
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [sys.executable, "-c", RACE, "client", "--superlink", "127.0.0.1:9", "--partition-id",
         "0", "--num-partitions", "2", "--insecure", "--allow-any-app", "--no-worker",
         "--state-dir", str(tmp_path / "state"), "--port", str(taken_port)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("pollen: error:")]
    assert len(errors) == 1, done.stderr
    assert f"127.0.0.1:{taken_port} is already in use" in errors[0], done.stderr
    assert "choose another --port" in errors[0]
    assert "Traceback" not in done.stdout + done.stderr
