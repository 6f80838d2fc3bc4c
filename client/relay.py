"""The relay between a ClientApp process and its node's resident worker (client.worker).

In deployment Flower starts a new ClientApp process for every message. A node started by
`pollen client` or `pollen deploy` also runs one long-lived worker (`python -m client.worker`)
that has imported torch and keeps the node's partition in memory. The ClientApp process then
only relays: it sends the message's content and context over a Unix socket (a file in a
directory only this user can open; nothing listens on the network) and returns the worker's
reply. This module is that relay's side and the wire format both sides share; it imports
neither torch nor any handler.

What the relay does when the worker is not there:
- no worker configured for this node (`POLLEN_WORKER_SOCKET` unset: simulation, tests): the
  ClientApp runs the handler itself, as always;
- no worker listening, or one started from other code than the relay's: it starts one from its
  own code and relays to it once it is ready;
- the worker cannot be started, or dies while handling the message: one log line, and the
  ClientApp runs the handler itself. The personal state on disk is the source of truth, so
  nothing is lost either way.

A reply is accepted only if it names the run and the message that were sent.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.common.serde import context_to_proto, recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict  # type: ignore[attr-defined]

log = logging.getLogger("flwr.pollen")

SOCKET_ENV = "POLLEN_WORKER_SOCKET"
"""Environment variable naming the node's worker socket; set for the SuperNode and inherited by
its ClientApp processes."""

KEEP_ENV = "POLLEN_WORKER_KEEP"
"""Environment variable: the partitions a worker keeps in memory. A worker shared by the nodes of
one machine (`pollen deploy`) keeps one per node; a node's ClientApps inherit it, so a worker
one of them starts again keeps as many."""

START_TIMEOUT = 120.0
"""Seconds a relay waits for a worker it started to listen (import torch, read the partition)."""

APP_PACKAGES = ("client", "pollen", "models", "strategies", "server", "federated_data")
"""The packages whose sources make up a worker's code (its fingerprint)."""

NOT_CODE = frozenset({"pollen/bundle_signature.py"})
"""Files in those packages that are not code: the signature a signed bundle carries
(pollen.tools.signing.SIGNATURE_FILE), absent from the checkout the worker may run from."""

_HEADER = struct.Struct(">I")
_BLOB = struct.Struct(">Q")


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


# ---- where a node's worker lives ------------------------------------------------------------
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


# ---- the wire format ------------------------------------------------------------------------
def send_frame(conn: socket.socket, header: dict[str, Any], blobs: Sequence[bytes] = ()) -> None:
    head = json.dumps({**header, "blobs": [len(b) for b in blobs]}).encode()
    conn.sendall(_HEADER.pack(len(head)) + head)
    for blob in blobs:
        conn.sendall(blob)


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed before the whole frame arrived")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(conn: socket.socket) -> tuple[dict[str, Any], list[bytes]]:
    (size,) = _HEADER.unpack(_recv_exact(conn, _HEADER.size))
    header = json.loads(_recv_exact(conn, size))
    if not isinstance(header, dict):
        raise ValueError("frame header is not an object")
    blobs = [_recv_exact(conn, int(n)) for n in header.get("blobs", [])]
    return header, blobs


def encode_content(content: RecordDict) -> bytes:
    return bytes(recorddict_to_proto(content).SerializeToString())


def decode_content(blob: bytes) -> RecordDict:
    proto = ProtoRecordDict()
    proto.ParseFromString(blob)
    return recorddict_from_proto(proto)


# ---- the relay's side -----------------------------------------------------------------------
def configured_socket() -> Path | None:
    value = os.environ.get(SOCKET_ENV, "")
    return Path(value) if value else None


def _connect(sock: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(sock))
    except OSError:
        conn.close()
        return None
    return conn


def _exchange(
    sock: Path, header: dict[str, Any], blobs: Sequence[bytes]
) -> tuple[dict[str, Any], list[bytes]] | None:
    """One request and its reply; None when no worker listens at `sock`."""
    conn = _connect(sock)
    if conn is None:
        return None
    with conn:
        try:
            send_frame(conn, header, blobs)
            return recv_frame(conn)
        except (OSError, ValueError) as exc:  # died while handling the message
            raise WorkerUnavailable(f"the worker at {sock} stopped answering ({exc})") from None


def _start_and_wait(sock: Path, reason: str) -> None:
    """Start a worker from this app's code (one relay at a time: a lock beside the socket) and
    wait until it listens."""
    with open(sock.with_suffix(".start"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        answer = _exchange(sock, {"op": "ping"}, ())
        if answer is not None and answer[0].get("code") == code_fingerprint():
            return  # another relay started it meanwhile
        if answer is not None:  # a worker from other code: ask it to go
            with contextlib.suppress(WorkerUnavailable):
                _exchange(sock, {"op": "stop"}, ())
        log.info("pollen: %s; starting a worker for this node", reason)
        proc = start_worker(sock)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise WorkerUnavailable(f"the worker exited at start (code {proc.returncode})")
            answer = _exchange(sock, {"op": "ping"}, ())
            if answer is not None and answer[0].get("code") == code_fingerprint():
                return
            time.sleep(0.1)
        raise WorkerUnavailable(f"the worker did not listen within {START_TIMEOUT:g} s")


def forward(msg: Message, context: Context, sock: Path, timing: bool) -> RecordDict:
    """The worker's reply content to `msg`; the worker is started first when none listens or one
    from other code does. Raises WorkerUnavailable when it cannot be served there, and re-raises
    an exception the handler raised in the worker (same type name and text)."""
    header = {
        "op": "handle",
        "code": code_fingerprint(),
        "run-id": context.run_id,
        "message-id": msg.metadata.message_id,
        "message-type": msg.metadata.message_type,
        "timing": timing,
    }
    blobs = [bytes(context_to_proto(context).SerializeToString()), encode_content(msg.content)]
    answer = _exchange(sock, header, blobs)
    if answer is None or answer[0].get("stale"):
        _start_and_wait(
            sock, "no worker listens" if answer is None else "the worker runs other code"
        )
        answer = _exchange(sock, header, blobs)
        if answer is None or answer[0].get("stale"):
            raise WorkerUnavailable("the worker it started does not take the message")
    reply, reply_blobs = answer
    if reply.get("run-id") != context.run_id or reply.get("message-id") != header["message-id"]:
        raise WorkerUnavailable(
            f"the worker answered for run {reply.get('run-id')} message {reply.get('message-id')}"
            f", not run {context.run_id} message {header['message-id']}"
        )
    if "error" in reply:
        raise remote_error(str(reply.get("error-type", "RuntimeError")), str(reply["error"]))
    if len(reply_blobs) != 1:
        raise WorkerUnavailable("the worker's reply carries no content")
    return decode_content(reply_blobs[0])


def remote_error(qualified_type: str, text: str) -> Exception:
    """An exception that prints as the one the handler raised in the worker (Flower's error
    reply carries the type's name and the text)."""
    module, _, name = qualified_type.rpartition(".")
    builtin = getattr(builtins, name, None) if module in ("", "builtins") else None
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        return builtin(text)
    kind = type(name or "RuntimeError", (RuntimeError,), {"__module__": module or "builtins"})
    return kind(text)
