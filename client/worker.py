"""A client node's resident worker: one long-lived process that answers the node's messages.

    python -m client.worker --socket PATH

`pollen client` and `pollen deploy` start one beside every SuperNode; a ClientApp process
starts one when it finds none (client.relay). The worker imports torch once (and initialises
CUDA once, when there is a GPU), keeps the node's partition in memory, and answers the
messages its node's ClientApp processes relay to it, one at a time, over a Unix socket that
only this user can open. It runs the same handlers a ClientApp runs
(client.dispatch.answer_node), with the same personal state on disk, which stays the source
of truth: a worker killed at any point loses nothing, and a replacement gives the same replies.

It exits when the node's owner is gone (nobody holds the owner lock beside the socket), when
another worker has taken its socket, on SIGTERM, or when a relay from other code asks it to.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from flwr.common.serde import context_from_proto
from flwr.proto.message_pb2 import Context as ProtoContext  # type: ignore[attr-defined]

from client import env as client_env
from client import relay, resident
from client.dispatch import answer_node
from client.env import ClientEnv

ACCEPT_TIMEOUT = 1.0
"""Seconds between checks that the owner is alive and the socket still this worker's."""


def _say(text: str) -> None:
    print(f"pollen worker {os.getpid()}: {text}", file=sys.stderr, flush=True)


def _warm_up() -> str:
    """What every message would otherwise pay first: torch and its lazily imported parts, and
    the CUDA context when there is a GPU. Returns the device it found."""
    import torch  # lazy: torch (imported once, before the worker listens)

    if torch.cuda.is_available():
        torch.cuda.init()
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return "cpu"


class Worker:
    def __init__(self, sock: Path) -> None:
        self.sock = sock
        self.code = resident.code_fingerprint()
        self.listener: socket.socket | None = None
        self.inode: int | None = None
        self.served = 0

    def listen(self) -> None:
        """Bind a fresh socket and move it onto the node's path in one step, so a relay finds
        either the old worker's socket or this one's, never a half-made one."""
        tmp = self.sock.with_name(f".{self.sock.stem}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp))
        os.chmod(tmp, 0o600)
        listener.listen(128)  # a worker shared by a machine's nodes: all may relay at once
        listener.settimeout(ACCEPT_TIMEOUT)
        os.replace(tmp, self.sock)
        self.listener = listener
        self.inode = self.sock.stat().st_ino

    def still_mine(self) -> bool:
        try:
            return self.sock.stat().st_ino == self.inode
        except OSError:
            return False

    def serve(self) -> str:
        """Answer requests until a reason to stop; returns that reason."""
        assert self.listener is not None
        while True:
            if not resident.owner_alive(self.sock):
                return "the node's owner is gone"
            if not self.still_mine():
                return "another worker took the socket"
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(None)
                try:
                    header, blobs = relay.recv_frame(conn)
                except (OSError, ValueError) as exc:
                    _say(f"ignored a malformed request ({exc})")
                    continue
                op = header.get("op")
                try:
                    if op == "ping":
                        relay.send_frame(conn, {"code": self.code, "pid": os.getpid()})
                    elif op == "stop":
                        relay.send_frame(conn, {"stopping": True})
                        return "a relay from other code asked it to stop"
                    elif op == "handle":
                        self.handle(conn, header, blobs)
                    else:
                        relay.send_frame(conn, {"error": f"unknown request {op!r}"})
                except OSError as exc:  # the relay went away; its message is its own concern
                    _say(f"could not answer a relay ({exc})")

    def handle(self, conn: socket.socket, header: dict[str, Any], blobs: list[bytes]) -> None:
        ids = {"run-id": header.get("run-id"), "message-id": header.get("message-id")}
        if header.get("code") != self.code:
            relay.send_frame(conn, {**ids, "stale": True})
            return
        started = time.perf_counter()
        try:
            if len(blobs) != 2:
                raise ValueError(f"a message request carries 2 parts, not {len(blobs)}")
            proto = ProtoContext()
            proto.ParseFromString(blobs[0])
            context = context_from_proto(proto)
            if context.run_id != ids["run-id"]:
                raise ValueError(f"context of run {context.run_id} for run {ids['run-id']}")
            env = ClientEnv.from_context(context)
            content = relay.decode_content(blobs[1])
            reply = answer_node(str(header["message-type"]), content, env)
            encoded = relay.encode_content(reply)
        except Exception as exc:
            _say(f"handler raised, for run {ids['run-id']}:\n{traceback.format_exc()}")
            text = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)
            kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
            relay.send_frame(conn, {**ids, "error": text, "error-type": kind})
            return
        self.served += 1
        relay.send_frame(conn, {**ids, "seconds": time.perf_counter() - started}, [encoded])

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        if self.still_mine():
            self.sock.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client.worker", description=__doc__)
    parser.add_argument("--socket", required=True, help="the node's worker socket")
    parser.add_argument(
        "--keep",
        type=int,
        default=resident.kept_partitions(),
        help="partitions kept in memory (a worker shared by N nodes keeps N; default "
        f"${resident.KEEP_ENV} or 2)",
    )
    args = parser.parse_args(argv)
    sock = Path(args.socket)
    if not resident.owner_alive(sock):
        _say(f"no node owns {sock} (nobody holds {resident.owner_lock(sock)}); not starting")
        return 2

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    started = time.perf_counter()
    device = _warm_up()
    client_env.keep_data_resident(max(1, args.keep))
    worker = Worker(sock)
    worker.listen()
    _say(f"serving {sock} on {device} (ready in {time.perf_counter() - started:.1f} s)")
    try:
        reason = worker.serve()
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        worker.close()
    _say(f"stopped after {worker.served} messages: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
