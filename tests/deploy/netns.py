"""Linux network namespaces for tests that need hosts with their own addresses: `<tag>-link`
holds a bridge at `<subnet>.1`, each `<tag>-n<i>` a veth end at `<subnet>.<10 + i>`. Root is
needed; `permission()` says why they cannot be used otherwise."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


class Namespaces:
    """Network namespaces `<tag>-link` (with the bridge) and `<tag>-n<i>`, torn down in full."""

    def __init__(self, tag: str, nodes: int, subnet: str = "10.231.7") -> None:
        self.subnet, self.link_ip = subnet, f"{subnet}.1"
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
        (hosts / "hosts").write_text(f"127.0.0.1 localhost\n{self.link_ip} superlink\n")

    def up(self) -> None:
        self._add(self.link)
        self._must("-n", self.link, "link", "add", "br0", "type", "bridge")
        self._must("-n", self.link, "addr", "add", f"{self.link_ip}/24", "dev", "br0")
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
        return f"{self.subnet}.{10 + i}"

    def down(self) -> None:
        for name in self.made:
            _ip("netns", "del", name)  # takes its veth ends and the bridge with it
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
        with contextlib.suppress(OSError):
            Path("/etc/netns").rmdir()  # only if nothing else uses it


def permission() -> str | None:
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




@contextlib.contextmanager
def namespaces_or_skip(tag: str, nodes: int, subnet: str = "10.231.7") -> Iterator[Namespaces]:
    """Namespaces up for the test, torn down after it; the test is skipped, with the reason,
    where they cannot be made."""
    import pytest

    reason = permission()
    if reason:
        pytest.skip(reason)
    ns = Namespaces(tag, nodes, subnet)
    try:
        ns.up()
    except (RuntimeError, OSError) as exc:
        ns.down()
        pytest.skip(f"network namespaces not usable: {exc}")
    try:
        yield ns
    finally:
        ns.down()
