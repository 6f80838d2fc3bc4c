"""A node's resident worker seen from outside: where its socket lives, which code it runs and
who owns it (client.resident)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import tomllib

from client import resident

ROOT = Path(__file__).resolve().parents[2]


def test_the_fingerprint_covers_every_package_the_distribution_installs() -> None:
    """A worker serves only relays from the same code: a package left out of the fingerprint
    would let a worker running its old copy serve a relay of the new one."""
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    assert set(resident.APP_PACKAGES) == set(wheel["targets"]["wheel"]["packages"])


def test_the_owner_lock_is_held_while_the_node_lives(tmp_path: Path) -> None:
    sock = resident.socket_path(f"{tmp_path}/node")
    assert not resident.owner_alive(sock)
    fd = resident.hold_owner_lock(sock)
    try:
        assert resident.owner_alive(sock)
    finally:
        resident.release_owner_lock(sock, fd)
    assert not resident.owner_alive(sock) and not resident.owner_lock(sock).exists()


def test_a_worker_without_an_owner_does_not_start(tmp_path: Path) -> None:
    sock = resident.socket_path(f"{tmp_path}/orphan")
    done = subprocess.run(
        resident.worker_argv(sock), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2 and "no node owns" in done.stderr
    assert not sock.exists()


def test_the_socket_directory_is_private() -> None:
    directory = resident.socket_dir()
    assert directory.stat().st_mode & 0o777 == 0o700


def test_the_fingerprint_ignores_the_bundle_signature_only(tmp_path: Path) -> None:
    from pollen.tools.signing import SIGNATURE_FILE

    assert SIGNATURE_FILE in resident.NOT_CODE
    root = tmp_path / "app"
    (root / "pollen").mkdir(parents=True)
    (root / "pollen" / "a.py").write_text("x = 1\n")
    before = resident.code_fingerprint(root)
    (root / SIGNATURE_FILE).write_text("SIGNATURE = 'abc'\n")
    assert resident.code_fingerprint(root) == before
    (root / "pollen" / "a.py").write_text("x = 2\n")
    assert resident.code_fingerprint(root) != before
