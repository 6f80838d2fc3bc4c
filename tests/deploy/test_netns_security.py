"""`pollen server` as another machine sees it: the server in one network namespace, a second
machine in another with its own address. By default only the Fleet API (what SuperNodes need)
answers that machine; the HTTP API (submitting runs, i.e. running code on every client) does
not. With `--expose-api` it does, and the server said so in one line. Skipped, with the reason,
where namespaces are not permitted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.netns import Namespaces, namespaces_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
HTTP, FLEET = 9093, 9092


@pytest.fixture
def hosts() -> Iterator[Namespaces]:
    with namespaces_or_skip(f"ps{os.getpid() % 100000}", 1, subnet="10.231.9") as ns:
        yield ns


def _in(ns: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def _reachable(ns: str, host: str, port: int) -> bool:
    """A TCP connection from namespace `ns` to host:port is accepted."""
    probe = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"
    return _in(ns, sys.executable, "-c", probe, host, str(port)).returncode == 0


def _health(ns: str, host: str, port: int) -> str:
    probe = (
        "import sys,urllib.request as u; "
        "print(u.urlopen(f'http://{sys.argv[1]}:{sys.argv[2]}/health', timeout=5).status)"
    )
    return _in(ns, sys.executable, "-c", probe, host, str(port)).stdout.strip()


def _server(ns: str, tmp: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"server{len(extra)}.log"
    env = dict(os.environ, FLWR_HOME=str(tmp / "home"), FLWR_TELEMETRY_ENABLED="0",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))  # fmt: skip
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "pollen.tools.cli", "server",
             "--insecure", "--port", str(HTTP), "--fleet-port", str(FLEET), *extra],
            stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    return proc, log


def _wait_listening(ns: str, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")
        if f":{port} " in _in(ns, "ss", "-ltnH").stdout:
            return
        time.sleep(0.5)
    raise AssertionError(f"nothing listens on {port}:\n{log.read_text(errors='replace')}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_only_the_fleet_api_is_reachable_from_another_machine_by_default(
    hosts: Namespaces, tmp_path: Path
) -> None:
    server_ns, other = hosts.link, hosts.nodes[0]
    address = hosts.link_ip
    assert _reachable(other, address, 1) is False  # the probe can fail
    proc, log = _server(server_ns, tmp_path)
    try:
        _wait_listening(server_ns, HTTP, proc, log)
        _wait_listening(server_ns, FLEET, proc, log)
        assert _reachable(other, address, FLEET)
        assert not _reachable(other, address, HTTP)
        assert _health(server_ns, "127.0.0.1", HTTP) == "200"  # the operator's own machine
        assert "--expose-api" not in log.read_text(errors="replace")
    finally:
        _stop(proc)

    proc, log = _server(server_ns, tmp_path, "--expose-api")
    try:
        _wait_listening(server_ns, HTTP, proc, log)
        assert _health(other, address, HTTP) == "200"
        warnings = [line for line in log.read_text(errors="replace").splitlines()
                    if line.startswith("pollen: warning: --expose-api")]  # fmt: skip
        assert len(warnings) == 1 and "run code" in warnings[0], warnings
    finally:
        _stop(proc)
    listening = _in(server_ns, "ss", "-ltnH").stdout
    assert f":{HTTP} " not in listening and f":{FLEET} " not in listening
