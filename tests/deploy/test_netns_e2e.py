"""The compose topology without Docker: the SuperLink (and the ServerApp's SuperExec, and the
run submitter) in one Linux network namespace, each SuperNode in its own, linked by veth pairs
to a bridge, each with its own address; the commands are docker-compose.yml's own (volumes
mapped to directories, the name `superlink` resolved through /etc/netns/<ns>/hosts), over TLS
with SuperNode authentication. Skipped, with the reason, where namespaces are not permitted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pollen.core.rundir import read_jsonl
from tests.deploy.compose import COMPOSE, ROOT, merged
from tests.deploy.netns import Namespaces, namespaces_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CLIENTS = 2
# Dockerfile ENV (what every container has besides the compose `environment`)
IMAGE_ENV = {"FLWR_HOME": "/flwr", "POLLEN_CACHE_DIR": "/cache", "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    with namespaces_or_skip(f"pl{os.getpid() % 100000}", CLIENTS) as ns:
        yield ns


class Services:
    """Compose services as processes: a service's volumes become directories under `root`."""

    def __init__(self, doc: Mapping[str, Any], root: Path) -> None:
        self.doc, self.root = doc, root
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        bindir = root / "bin"  # `pollen` as the image has it: this checkout's CLI
        bindir.mkdir(parents=True)
        (bindir / "pollen").write_text(
            f'#!/bin/sh\nexec "{sys.executable}" -m pollen.tools.cli "$@"\n'
        )
        (bindir / "pollen").chmod(0o755)
        self.path = os.pathsep.join([str(bindir), str(Path(sys.executable).parent),
                                     os.environ.get("PATH", "")])  # fmt: skip

    def mounts(self, service: str) -> dict[str, Path]:
        """Container path -> host directory (named volumes shared between services)."""
        table: dict[str, Path] = {"/flwr": self.root / "flwr" / service}
        for volume in self.doc["services"][service].get("volumes", []):
            name, target = volume.split(":")[:2]
            table[target] = self.root / "volumes" / name
        for path in table.values():
            path.mkdir(parents=True, exist_ok=True)
        return table

    def _map(self, value: str, table: Mapping[str, Path]) -> str:
        for target in sorted(table, key=len, reverse=True):
            if value == target or value.startswith(target + "/"):
                return str(table[target]) + value[len(target) :]
        return value

    def command(self, service: str, extra: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
        spec = self.doc["services"][service]
        table = self.mounts(service)
        argv = [self._map(a, table) for a in [*spec["command"], *extra]]
        env = {**IMAGE_ENV, **{k: str(v) for k, v in spec.get("environment", {}).items()}}
        env = {k: self._map(v, table) for k, v in env.items()}
        env.update(PATH=self.path, PYTHONPATH=str(ROOT), HOME=str(self.root), HOSTNAME=service)
        return argv, env

    def start(self, service: str, netns: str, hostname: str | None = None) -> None:
        argv, env = self.command(service)
        if hostname:
            env["HOSTNAME"] = hostname
        if self.doc["services"][service].get("restart") == "on-failure":
            # compose's restart policy (a SuperNode that connects before the SuperLink has
            # registered its key is refused once, then restarted)
            retry = 'until "$@"; do echo "exited with $?, restarting"; sleep 2; done'
            argv = ["sh", "-c", retry, "sh", *argv]
        with open(self.root / f"{hostname or service}.log", "ab") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", netns, *argv], cwd=ROOT, env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.procs.append((hostname or service, proc))

    def run(
        self, service: str, netns: str, extra: Sequence[str] = (), timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        argv, env = self.command(service, extra)
        return subprocess.run(["ip", "netns", "exec", netns, *argv], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _, proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for _, proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_compose_topology_in_network_namespaces(
    namespaces: Namespaces, tmp_path: Path, shared_cache: Path
) -> None:
    env = {"POLLEN_CLIENTS": str(CLIENTS), "POLLEN_ALGORITHM": "fedavg",
           "POLLEN_DATASET": "digits", "POLLEN_ROUNDS": "1"}  # fmt: skip
    services = Services(merged(COMPOSE, env=env), tmp_path)
    try:
        certs = services.run("certs", namespaces.link, timeout=60)
        assert certs.returncode == 0, certs.stdout + certs.stderr
        services.start("superlink", namespaces.link)
        services.start("serverapp", namespaces.link)
        for i, ns in enumerate(namespaces.nodes):
            services.start("supernode", ns, hostname=f"supernode-{i}")
        # the run service, plus settings that keep this test short
        short = ["--set", "poll-interval=0.5", "--set", "final-eval=false"]
        done = services.run("run", namespaces.link, extra=short, timeout=420)
        logs = {name: services.log(name)[-1500:] for name, _ in services.procs}
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{logs}"
        # the SuperNodes reached the SuperLink's Fleet port from their own addresses
        sockets = subprocess.run(["ip", "netns", "exec", namespaces.link, "ss", "-tnH", "state",
                                  "established", "sport", "= :9092"], capture_output=True,
                                 text=True, check=False).stdout  # fmt: skip
        for i in range(CLIENTS):
            assert namespaces.address(i) in sockets, sockets
        [out] = (tmp_path / "volumes" / "results").iterdir()  # a fresh directory per run
        assert out.name.startswith("fedavg-digits-")
        rows = read_jsonl(out / "metrics.jsonl")
        assert [r["round"] for r in rows] == [1] and rows[0]["train"]["clients"] == float(CLIENTS)
        assert "run" in done.stdout and "completed" in done.stdout
        superlink = services.log("superlink")
        assert "allow-list: 2 SuperNode keys" in superlink and "https://" in superlink
        for i in range(CLIENTS):
            node = services.log(f"supernode-{i}")
            assert "SuperNode ID" in node, node[-2000:]
        # each SuperNode claimed its own partition and kept its state there
        claims = sorted(
            p.name for p in (tmp_path / "volumes" / "client-state" / "claims").iterdir()
        )
        assert claims == [str(i) for i in range(CLIENTS)]
    finally:
        services.stop()
