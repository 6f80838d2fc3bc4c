"""The relay between a ClientApp process and its node's resident worker (client.worker).

In deployment Flower starts a new ClientApp process for every message. A node started by
`pollen client` or `pollen deploy` also runs one long-lived worker (`python -m client.worker`)
that has imported torch and keeps the node's partition in memory. The ClientApp process then
only relays: it sends the message's content and context over a Unix socket (a file in a
directory only this user can open; nothing listens on the network) and returns the worker's
reply. This module is that relay's side and the wire format both sides share; it imports
neither torch nor any handler. Where a node's worker lives, which code it runs and who owns it
is client.resident's.

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
import json
import logging
import os
import socket
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.common.serde import context_to_proto, recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict  # type: ignore[attr-defined]

from client import resident

log = logging.getLogger("flwr.pollen")

START_TIMEOUT = 120.0
"""Seconds a relay waits for a worker it started to listen (import torch, read the partition)."""

_HEADER = struct.Struct(">I")
_BLOB = struct.Struct(">Q")


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
    value = os.environ.get(resident.SOCKET_ENV, "")
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
            raise resident.WorkerUnavailable(
                f"the worker at {sock} stopped answering ({exc})"
            ) from None


def _start_and_wait(sock: Path, reason: str) -> None:
    """Start a worker from this app's code (one relay at a time: a lock beside the socket) and
    wait until it listens."""
    with open(sock.with_suffix(".start"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        answer = _exchange(sock, {"op": "ping"}, ())
        if answer is not None and answer[0].get("code") == resident.code_fingerprint():
            return  # another relay started it meanwhile
        if answer is not None:  # a worker from other code: ask it to go
            with contextlib.suppress(resident.WorkerUnavailable):
                _exchange(sock, {"op": "stop"}, ())
        log.info("pollen: %s; starting a worker for this node", reason)
        proc = resident.start_worker(sock)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise resident.WorkerUnavailable(
                    f"the worker exited at start (code {proc.returncode})"
                )
            answer = _exchange(sock, {"op": "ping"}, ())
            if answer is not None and answer[0].get("code") == resident.code_fingerprint():
                return
            time.sleep(0.1)
        raise resident.WorkerUnavailable(f"the worker did not listen within {START_TIMEOUT:g} s")


def forward(msg: Message, context: Context, sock: Path, timing: bool) -> RecordDict:
    """The worker's reply content to `msg`; the worker is started first when none listens or one
    from other code does. Raises resident.WorkerUnavailable when it cannot be served there, and
    re-raises an exception the handler raised in the worker (same type name and text)."""
    header = {
        "op": "handle",
        "code": resident.code_fingerprint(),
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
            raise resident.WorkerUnavailable("the worker it started does not take the message")
    reply, reply_blobs = answer
    if reply.get("run-id") != context.run_id or reply.get("message-id") != header["message-id"]:
        raise resident.WorkerUnavailable(
            f"the worker answered for run {reply.get('run-id')} message {reply.get('message-id')}"
            f", not run {context.run_id} message {header['message-id']}"
        )
    if "error" in reply:
        raise remote_error(str(reply.get("error-type", "RuntimeError")), str(reply["error"]))
    if len(reply_blobs) != 1:
        raise resident.WorkerUnavailable("the worker's reply carries no content")
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
