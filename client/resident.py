"""A node's resident worker (client.worker): where its socket lives, which code it runs, who
owns it and how it is started. Node ownership lives here, apart from the relay's wire.

The node's owner (`pollen client`, `pollen deploy`) holds a shared lock beside the worker's
socket while the node lives; the worker exits once nobody holds it. The relay (client.relay)
starts a worker from its own code when none listens; the owner starts one when the node starts.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

SOCKET_ENV = "POLLEN_WORKER_SOCKET"
"""Environment variable naming the node's worker socket; set for the SuperNode and inherited by
its ClientApp processes."""

KEEP_ENV = "POLLEN_WORKER_KEEP"
"""Environment variable: the partitions a worker keeps in memory. A worker shared by the nodes of
one machine (`pollen deploy`) keeps one per node; a node's ClientApps inherit it, so a worker
one of them starts again keeps as many."""

APP_PACKAGES = (
    "client", "pollen", "models", "strategies", "server", "federated_data", "robust", "secagg",
)
"""The packages whose sources make up a worker's code (its fingerprint)."""

NOT_CODE = frozenset({"pollen/bundle_signature.py"})
"""Files in those packages that are not code: the signature a signed bundle carries
(pollen.tools.signing.SIGNATURE_FILE), absent from the checkout the worker may run from."""

class WorkerUnavailable(RuntimeError):
    """The worker could not take the message; the ClientApp runs the handler itself."""


def app_root() -> Path:
    """The directory this app's packages were imported from (a bundle Flower installed, or the
    source checkout)."""
    return Path(__file__).resolve().parent.parent


def code_fingerprint(root: Path | None = None) -> str:
    """A hash of the app's Python sources: a worker serves only relays from the same code."""
    root = root or app_root()
    digest = hashlib.sha256()
    for package in APP_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path.relative_to(root).as_posix() in NOT_CODE:
                continue
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def socket_dir() -> Path:
    """A directory only this user can enter, for the workers' sockets (short paths: a Unix
    socket's path is limited to about 100 bytes)."""
    directory = Path(tempfile.gettempdir()) / f"pollen-workers-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise WorkerUnavailable(
            f"{directory} is not a private directory of this user (mode {oct(info.st_mode)})"
        )
    return directory


def socket_path(node_key: str) -> Path:
    """The worker socket of the node identified by `node_key` (e.g. its state directory and
    partition): the same key gives the same path, other nodes on this machine other paths."""
    name = hashlib.sha256(node_key.encode()).hexdigest()[:24]
    return socket_dir() / f"{name}.sock"


def owner_lock(sock: Path) -> Path:
    """The file the node's owner (`pollen client`, `pollen deploy`) holds a lock on while the
    node lives; a worker exits once nobody holds it."""
    return sock.with_suffix(".owner")


def hold_owner_lock(sock: Path) -> int:
    """Take the owner's (shared) lock; returns the descriptor, to keep open while the node
    lives (closing it, or the owner's death, releases the lock)."""
    fd = os.open(owner_lock(sock), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def release_owner_lock(sock: Path, fd: int) -> None:
    """The node's end: its worker exits (no owner file, no lock), and the files beside the
    socket go."""
    for path in (owner_lock(sock), sock.with_suffix(".start")):
        path.unlink(missing_ok=True)
    os.close(fd)


def owner_alive(sock: Path) -> bool:
    """Someone holds the node's owner lock."""
    try:
        fd = os.open(owner_lock(sock), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # (releases the lock if it was taken)
    return False


def kept_partitions() -> int:
    """The partitions a worker keeps (KEEP_ENV; 2 when unset or not a count)."""
    try:
        return max(1, int(os.environ.get(KEEP_ENV, "2")))
    except ValueError:
        return 2


def worker_argv(sock: Path) -> list[str]:
    return [sys.executable, "-m", "client.worker", "--socket", str(sock)]


def start_worker(sock: Path, root: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a worker for `sock` from the code in `root` (default: this app's). It runs in its
    own session, writes to this process's output and exits when the node's owner is gone."""
    root = root or app_root()
    return subprocess.Popen(
        worker_argv(sock),
        cwd=root,
        env=worker_env(os.environ, root),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def worker_env(env: Mapping[str, str], root: Path) -> dict[str, str]:
    """`env` for a worker that imports the app's code from `root` first."""
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    return out
