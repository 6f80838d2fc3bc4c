"""The resident worker and its relay, end to end on CPU: a real worker process serving messages
over its Unix socket, compared with the same messages answered in-process."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from client import relay, resident
from client.app import app
from client.env import ClientEnv
from pollen.core import protocol

TIMING = ("time-", "peak-rss-mb", "relay-peak-rss-mb")


def _context(cfg: dict[str, Any], run_id: int = 7, **node: Any) -> Context:
    return Context(
        run_id=run_id, node_id=1, node_config=node, state=RecordDict(), run_config=dict(cfg)
    )


def _message(message_type: str, rnd: int = 1) -> Message:
    content = protocol.instruction(rnd, message_type)
    return Message(content, dst_node_id=1, message_type=message_type)


def _plain(content: RecordDict) -> dict[str, Any]:
    """A reply's records as plain values, timing figures left out."""
    out: dict[str, Any] = {}
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            out[name] = {k: v.numpy().tobytes() for k, v in record.items()}
        elif isinstance(record, MetricRecord):
            out[name] = {k: v for k, v in record.items() if not k.startswith(TIMING)}
        else:
            out[name] = dict(record)
    return out


def _pid(sock: Path) -> int:
    answer = relay._exchange(sock, {"op": "ping"}, ())
    assert answer is not None
    return int(answer[0]["pid"])


def _wait_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with _Reap():
            pass
        time.sleep(0.1)
    return False


class _Reap:
    """Collect exited children (workers this test process started) so they do not linger as
    zombies that still answer kill(pid, 0)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A node's worker socket whose owner (this test) holds the lock; the worker is started by
    the first relayed message, as after a crash."""
    sock = resident.socket_path(f"{tmp_path}/node")
    lock = resident.hold_owner_lock(sock)
    monkeypatch.setenv(resident.SOCKET_ENV, str(sock))
    yield sock
    pid = None
    answer = relay._exchange(sock, {"op": "ping"}, ()) if sock.exists() else None
    if answer is not None:
        pid = int(answer[0]["pid"])
    resident.release_owner_lock(sock, lock)  # the node ends: its worker must exit by itself
    if pid is not None:
        assert _wait_gone(pid), "the worker outlived its node's owner"
    assert not resident.owner_lock(sock).exists() and not sock.with_suffix(".start").exists()


def test_relayed_replies_equal_in_process_replies(
    run_config: dict[str, Any], node: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = {**run_config, "algorithm": "local", "client-timing": True}
    relayed = [app(_message(t, r), _context(cfg, **{"partition-id": 1})) for t, r in (
        ("query.hello", 1), ("train", 1), ("train", 2), ("evaluate", 3))]  # fmt: skip
    pid = _pid(node)
    metrics: Any = relayed[1].content[protocol.METRICS]
    assert metrics["time-import-torch"] == 0.0 and metrics["time-relay"] >= 0.0
    assert "time-startup" not in metrics  # the worker's first message was the hello

    monkeypatch.delenv(resident.SOCKET_ENV)
    local = {**cfg, "out-dir": str(tmp_path / "in-process")}
    direct = [app(_message(t, r), _context(local, **{"partition-id": 1})) for t, r in (
        ("query.hello", 1), ("train", 1), ("train", 2), ("evaluate", 3))]  # fmt: skip
    for a, b in zip(relayed, direct, strict=True):
        assert _plain(a.content) == _plain(b.content)
    assert _pid(node) == pid  # one worker served them all


def test_one_worker_serves_the_nodes_that_share_it(
    run_config: dict[str, Any], node: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pollen deploy` gives all its SuperNodes one worker: messages of three clients,
    interleaved, get the replies each client gets in-process, from one worker process."""
    monkeypatch.setenv(resident.KEEP_ENV, "3")  # inherited by the worker the relay starts
    cfg = {**run_config, "algorithm": "local"}
    steps = [(t, r, c) for t, r in (("train", 1), ("train", 2), ("evaluate", 3)) for c in (0, 1, 2)]
    relayed = [app(_message(t, r), _context(cfg, **{"partition-id": c})) for t, r, c in steps]
    pid = _pid(node)
    monkeypatch.delenv(resident.SOCKET_ENV)
    local = {**cfg, "out-dir": str(tmp_path / "in-process")}
    direct = [app(_message(t, r), _context(local, **{"partition-id": c})) for t, r, c in steps]
    for a, b, step in zip(relayed, direct, steps, strict=True):
        assert _plain(a.content) == _plain(b.content), step
        assert a.content[protocol.ENVELOPE]["client-id"] == step[2]  # type: ignore[index]
    assert _pid(node) == pid  # one worker served them all


def test_a_worker_killed_between_messages_is_restarted_and_loses_nothing(
    run_config: dict[str, Any], node: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = {**run_config, "algorithm": "local"}
    ctx = _context(cfg, **{"partition-id": 0})
    first = app(_message("train", 1), ctx)
    pid = _pid(node)
    os.kill(pid, signal.SIGKILL)
    assert _wait_gone(pid)
    second = app(_message("train", 2), ctx)  # finds no worker: starts one, relays to it
    assert _pid(node) != pid
    state = ClientEnv.from_context(ctx).state
    assert [p.name for p in sorted(state.dir.iterdir())] == [
        "state-000001.npz",
        "state-000002.npz",
    ]

    monkeypatch.delenv(resident.SOCKET_ENV)
    local = _context({**cfg, "out-dir": str(tmp_path / "in-process")}, **{"partition-id": 0})
    assert _plain(app(_message("train", 1), local).content) == _plain(first.content)
    assert _plain(app(_message("train", 2), local).content) == _plain(second.content)


def test_handler_errors_reach_flower_as_they_would_in_process(
    run_config: dict[str, Any], node: Path
) -> None:
    ctx = _context({**run_config, "algorithm": "local"}, **{"partition-id": 0})
    with pytest.raises(KeyError, match=r"no client handler for 'query\.noop'"):
        app(_message("query.noop"), ctx)
    bad = _context(run_config, **{"partition-id": 0, "num-partitions": 5})
    with pytest.raises(Exception, match="num-partitions=5") as raised:
        app(_message("query.hello"), bad)
    assert str(type(raised.value)) == "<class 'client.env.ClientConfigError'>"


def test_a_worker_of_other_code_is_replaced(
    run_config: dict[str, Any], node: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-code"
    for package in resident.APP_PACKAGES:
        shutil.copytree(
            resident.app_root() / package, other / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )  # fmt: skip
    with open(other / "client" / "handlers_note.py", "w") as fh:
        fh.write("NOTE = 'a different version'\n")
    assert resident.code_fingerprint(other) != resident.code_fingerprint()
    stale = resident.start_worker(node, other)
    deadline = time.monotonic() + 60
    while relay._exchange(node, {"op": "ping"}, ()) is None:
        assert stale.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    reply = app(_message("query.hello"), _context(run_config, **{"partition-id": 2}))
    assert reply.content[protocol.ENVELOPE]["client-id"] == 2  # type: ignore[index]
    assert stale.wait(timeout=15) == 0  # asked to stop, it did
    assert _pid(node) != stale.pid


def test_a_reply_for_another_run_or_message_is_refused(tmp_path: Path) -> None:
    """A worker that answers for another run (or message) than the relay sent: the relay does
    not pass the reply on."""
    sock = tmp_path / "fake.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(1)

    def fake_worker() -> None:
        conn, _ = listener.accept()
        with conn:
            header, _ = relay.recv_frame(conn)
            wrong = {"run-id": header["run-id"] + 1, "message-id": header["message-id"]}
            # the relay refuses the header and may close before the body is sent
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                relay.send_frame(conn, wrong, [relay.encode_content(RecordDict())])

    thread = threading.Thread(target=fake_worker)
    thread.start()
    with pytest.raises(resident.WorkerUnavailable, match="answered for run 8"):
        relay.forward(_message("query.hello"), _context({}, run_id=7), sock, False)
    thread.join()
    listener.close()


def test_a_worker_that_cannot_start_leaves_the_message_to_the_clientapp(
    run_config: dict[str, Any],
    node: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(sock: Path, root: Path | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["python3", "-c", "raise SystemExit(3)"])

    monkeypatch.setattr(resident, "start_worker", broken)
    reply = app(_message("query.hello"), _context(run_config, **{"partition-id": 1}))
    assert reply.content[protocol.ENVELOPE]["client-id"] == 1  # type: ignore[index]
    assert "the worker exited at start (code 3); this ClientApp runs the handler itself" in (
        caplog.text
    )


def test_resident_partitions_are_read_only(run_config: dict[str, Any], tmp_path: Path) -> None:
    from client import env as client_env

    client_env.keep_data_resident()
    try:
        env = ClientEnv.from_context(_context(run_config, **{"partition-id": 0}))
        again = ClientEnv.from_context(_context(run_config, **{"partition-id": 0}))
        assert again.data is env.data
        with pytest.raises(ValueError, match="read-only"):
            env.data.train.x[0] = np.zeros_like(env.data.train.x[0])
    finally:
        client_env._resident = None
