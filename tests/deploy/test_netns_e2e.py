"""The compose topology without Docker: the SuperLink (and the ServerApp's SuperExec, and the
run submitter) in one Linux network namespace, each SuperNode in its own, linked by veth pairs
to a bridge, each with its own address; the commands are docker-compose.yml's own (volumes
mapped to directories, the name `superlink` resolved through /etc/netns/<ns>/hosts), over TLS
with SuperNode authentication. Skipped, with the reason, where namespaces are not permitted."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from server.results import read_jsonl
from tests.deploy.compose import COMPOSE, ROOT, merged

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SUBNET = "10.231.7"
LINK_IP = f"{SUBNET}.1"
CLIENTS = 2
# Dockerfile ENV (what every container has besides the compose `environment`)
IMAGE_ENV = {"FLWR_HOME": "/flwr", "POLLEN_CACHE_DIR": "/cache", "PYTHONUNBUFFERED": "1"}


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


class Namespaces:
    """Network namespaces `<tag>-link` (with the bridge) and `<tag>-n<i>`, torn down in full."""

    def __init__(self, tag: str, nodes: int) -> None:
        self.link = f"{tag}-link"
        self.nodes = [f"{tag}-n{i}" for i in range(nodes)]
        self.tag = tag
        self.made: list[str] = []

    def _must(self, *args: str) -> None:
        done = _ip(*args)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def _add(self, name: str) -> None:
        self._must("netns", "add", name)
        self.made.append(name)
        self._must("-n", name, "link", "set", "lo", "up")
        hosts = Path("/etc/netns") / name
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts").write_text(f"127.0.0.1 localhost\n{LINK_IP} superlink\n")

    def up(self) -> None:
        self._add(self.link)
        self._must("-n", self.link, "link", "add", "br0", "type", "bridge")
        self._must("-n", self.link, "addr", "add", f"{LINK_IP}/24", "dev", "br0")
        self._must("-n", self.link, "link", "set", "br0", "up")
        for i, ns in enumerate(self.nodes):
            self._add(ns)
            near, far = f"{self.tag}v{i}a", f"{self.tag}v{i}b"  # veth pair: node end, bridge end
            self._must("link", "add", near, "netns", ns, "type", "veth", "peer", "name", far,
                       "netns", self.link)  # fmt: skip
            self._must("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", near)
            self._must("-n", ns, "link", "set", near, "up")
            self._must("-n", self.link, "link", "set", far, "master", "br0", "up")

    def address(self, i: int) -> str:
        return f"{SUBNET}.{10 + i}"

    def down(self) -> None:
        for name in self.made:
            _ip("netns", "del", name)  # takes its veth ends and the bridge with it
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
        with contextlib.suppress(OSError):
            Path("/etc/netns").rmdir()  # only if nothing else uses it


def _permission() -> str | None:
    """Why namespaces cannot be used here, or None when they can."""
    if sys.platform != "linux" or shutil.which("ip") is None:
        return "needs Linux with iproute2 (`ip`)"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"pollen-probe-{os.getpid()}"
    done = _ip("netns", "add", probe)
    if done.returncode != 0:
        return f"`ip netns add` not permitted: {done.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    reason = _permission()
    if reason:
        pytest.skip(reason)
    ns = Namespaces(f"pl{os.getpid() % 100000}", CLIENTS)
    try:
        ns.up()
    except (RuntimeError, OSError) as exc:
        ns.down()
        pytest.skip(f"network namespaces not usable: {exc}")
    yield ns
    ns.down()


class Services:
    """Compose services as processes: a service's volumes become directories under `root`."""

    def __init__(self, doc: Mapping[str, Any], root: Path) -> None:
        self.doc, self.root = doc, root
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        bindir = root / "bin"  # `pollen` as the image has it: this checkout's CLI
        bindir.mkdir(parents=True)
        (bindir / "pollen").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pollen.cli "$@"\n')
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
        out = tmp_path / "volumes" / "results" / "run"
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
