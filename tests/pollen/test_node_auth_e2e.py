"""SuperNode authentication on loopback, real Flower processes over gRPC + TLS: the SuperLink
accepts only SuperNodes whose keys are on its allow-list, a SuperNode that does not trust the
SuperLink's CA cannot connect, and a registered SuperNode keeps its node id across restarts
(its own and the SuperLink's)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from pollen.tools.local_federation import TLS, LocalFederation, node_key
from pollen.tools.node_service import supernode_argv
from pollen.tools.processes import Proc, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "generate-certs.sh"


def _certs(directory: Path, *extra: str) -> Path:
    subprocess.run(["bash", str(SCRIPT), str(directory), *extra], check=True, capture_output=True)
    return directory


def _exit_code(proc: Proc, timeout: float = 90) -> int:
    return proc.popen.wait(timeout=timeout)


def _statuses(fed: LocalFederation) -> dict[str, str]:
    return {str(n["node-id"]): str(n["status"]) for n in fed.nodes()}


def _wait_status(fed: LocalFederation, status: str, timeout: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = _statuses(fed)
        if status in nodes.values():
            return nodes
        time.sleep(1.0)
    raise AssertionError(f"no SuperNode {status} after {timeout:g} s: {_statuses(fed)}")


def test_allow_list_ca_and_identity_across_restarts(tmp_path: Path) -> None:
    certs = _certs(tmp_path / "certs", "--nodes", "2")
    other = TLS.from_dir(_certs(tmp_path / "other-ca"))
    tls = TLS.from_dir(certs)
    fed = LocalFederation(tmp_path / "fed")
    try:
        _, fleet = fed.start_superlink(tls=tls, auth=True)
        registered = certs / "supernodes" / "node-0.pub"
        fed.register_nodes([registered])
        fed.register_nodes([registered])  # again (a restarted SuperLink): accepted
        assert list(_statuses(fed).values()) == ["registered"]
        address = f"127.0.0.1:{fleet}"

        # a key that is not on the allow-list: refused, the SuperNode exits
        stranger = fed.start_supernode(1, 2, address, tls=tls, auth_key=node_key(certs, 1))
        assert _exit_code(stranger) != 0
        assert "Failed to activate SuperNode" in stranger.log_path.read_text()

        # a registered key, but the SuperNode trusts another CA: the TLS handshake fails
        argv = supernode_argv(address, free_port(), {"partition-id": 0, "num-partitions": 2},
                              other.ca_cert, node_key(certs, 0))  # fmt: skip
        wrong_ca = fed.spawn("wrong-ca", [*argv, "--max-retries", "0", "--max-wait-time", "3"])
        assert _exit_code(wrong_ca) != 0
        assert "CERTIFICATE_VERIFY_FAILED" in wrong_ca.log_path.read_text()
        assert list(_statuses(fed).values()) == ["registered"]  # neither got in

        # the registered node joins; stopped and started again it is the same node
        node = fed.start_supernode(0, 2, address, tls=tls, auth_key=node_key(certs, 0))
        first = _wait_status(fed, "online")
        node.popen.send_signal(signal.SIGTERM)
        assert _exit_code(node, 30) == 0
        assert _wait_status(fed, "offline").keys() == first.keys()
        node = fed.start_supernode(0, 2, address, tls=tls, auth_key=node_key(certs, 0))
        assert _wait_status(fed, "online") == first

        # the SuperLink restarted on its database still knows the node by the same id
        # (the node stops first: one that was still online when the SuperLink went down would
        # be refused until its heartbeat expires, about a minute)
        node.popen.send_signal(signal.SIGTERM)
        _wait_status(fed, "offline")
        fed.stop()
        _, fleet = fed.start_superlink(tls=tls, auth=True)
        fed.register_nodes([registered])
        fed.start_supernode(0, 2, f"127.0.0.1:{fleet}", tls=tls, auth_key=node_key(certs, 0))
        assert _wait_status(fed, "online") == first
    finally:
        fed.stop()
