"""Flower's processes on this machine: each started in its own process group, with the
environment they share, watched (an exit, a SuperNode restarted, a full disk in their logs) and
stopped together, so that teardown (on success, failure or Ctrl-C) leaves nothing behind.

Nothing here imports training code.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pollen.core import rundir
from pollen.core.contracts.launcher import LAUNCHER_PID
from pollen.tools.diagnosis import ConsoleCopy, known_cause, no_space
from pollen.tools.preflight import free_mb
from pollen.tools.progress import NODE_RESTART_LIMIT

PROJECT_DIR = Path(__file__).resolve().parents[2]
TASK_POLL_INTERVAL = "0.1"
"""Seconds between a SuperExec's polls for a new task (Flower's default: 1 s). Every message
waits for the next poll of its node's SuperExec, and every run for the SuperLink's; at 0.1 s
the polls cost little CPU (docs/performance.md). An operator's own
FLWR_SUPEREXEC_TASK_POLL_INTERVAL is kept."""

FLWR_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": os.environ.get(
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL", TASK_POLL_INTERVAL
    ),
}


class LaunchError(RuntimeError):
    """A process did not start, a run could not be submitted, or a run failed."""


class DiskFull(LaunchError):
    """A process of the federation logged a full disk: the run cannot go on."""


def die_with_parent() -> None:
    """Runs in each child before exec: on Linux the child is killed if the launcher dies (even
    by SIGKILL), so no SuperLink or SuperNode outlives it. SIGKILL, not SIGTERM: a SuperNode's
    graceful shutdown keeps retrying to deregister from a SuperLink that died with the launcher;
    the processes they started exit by watching their parent's pid."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def bin_path(name: str) -> str:
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise LaunchError(f"'{name}' not found; is flwr installed in this environment?")
    return found


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    console: ConsoleCopy | None = None
    """The process's output goes to this process's (`Supervisor.spawn(console=True)`)."""

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def failure(self) -> LaunchError:
        """The error to raise for the process's exit: DiskFull when the disk its log is on is
        full (the process could not write, and often not even log why), else LaunchError with
        `exit_reason`."""
        code = self.popen.returncode
        where = self.log_path.parent
        if free_mb(where) < 1:
            return DiskFull(
                f"no space left on device in {where} ({free_mb(where):.1f} MB free): "
                f"{self.name} exited (code {code})"
            )
        return LaunchError(self.exit_reason())

    def exit_reason(self) -> str:
        """Why the process exited, for `pollen: error:`: one line when its output shows a
        cause the operator can fix (pollen.tools.diagnosis), else its exit code and its last lines
        (on the console, the traceback held back is shown first)."""
        code = self.popen.returncode
        if self.console is not None:
            held = self.console.finish()
            cause = known_cause(self.console.tail)
            if cause is not None:
                return cause
            self.console.show(held)
            return f"{self.name} exited (code {code}); its output is above"
        tail = self.tail(200)
        cause = known_cause([tail])
        if cause is not None:
            return f"{self.name}: {cause} (its log: {self.log_path})"
        return f"{self.name} exited (code {code}):\n{self.tail()}"


@dataclass
class Node:
    """A SuperNode this federation started (with its app runner), and how to start it again."""

    partition_id: int
    launch: Callable[[], list[Proc]]
    procs: list[Proc]
    restarts: int = 0
    died_at: float | None = None
    exit_code: int | None = None


NODE_RESTART_BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""Seconds before each restart; the last repeats. An authenticated SuperNode restarted within
about a minute of its crash is refused (its old session is still online), so the attempts span
more than two minutes in all."""


@dataclass
class FlowerHome:
    """A work directory for Flower's processes and a private FLWR_HOME in it, with the
    environment they and the `flwr` CLI run in."""

    workdir: Path

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home = self.workdir / "flwr-home"
        self.home.mkdir(exist_ok=True)
        self.env = dict(os.environ, FLWR_HOME=str(self.home), **FLWR_ENV)
        self.env[LAUNCHER_PID] = str(os.getpid())
        self.env["PYTHONUNBUFFERED"] = "1"
        # Flower's daemons start `flower-superexec` and app processes by name: same environment.
        bindir = str(Path(sys.executable).parent)
        self.env["PATH"] = os.pathsep.join([bindir, self.env.get("PATH", "")])


@dataclass
class Supervisor(FlowerHome):
    """The Flower processes started here, each logging to `<workdir>/<name>.log`: watched while
    they run (an exit, a SuperNode restarted, a full disk in a log) and stopped together."""

    procs: list[Proc] = field(default_factory=list)
    restart_nodes: bool = False
    """Restart a SuperNode that dies (same partition, state and key) instead of failing."""
    events: Path | None = None
    """The run's events.jsonl, where node restarts are recorded beside the server's events."""
    started_nodes: dict[int, Node] = field(default_factory=dict)
    restart_log: list[dict[str, Any]] = field(default_factory=list)
    workers: list[Proc] = field(default_factory=list)
    """The workers started with the nodes: not part of a node, a worker that dies is started
    again by the node's next message (client.relay)."""
    _log_read: dict[Path, tuple[int, bytes]] = field(default_factory=dict)
    """How far `disk_full` has read each process's log, and the end of what it read."""

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        console: bool = False,
        track: bool = True,
    ) -> Proc:
        """Start `argv` logging to `<workdir>/<name>.log` (to this process's output if
        `console`); `track`: it must stay alive (`check_alive`)."""
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "ab") as log:
            self._log_read[log_path] = (log.tell(), b"")  # what was there before is not news
            popen = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE if console else log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env or self.env),
                start_new_session=True,
                cwd=self.workdir,
                preexec_fn=die_with_parent,
            )
        proc = Proc(name, popen, log_path, ConsoleCopy(popen) if console else None)
        if track:
            self.procs.append(proc)
        return proc

    def check_alive(self) -> None:
        """Raise LaunchError when a process has exited, unless it belongs to a SuperNode this
        federation restarts (`restart_nodes`): that node is started again after a backoff, on
        the same partition, state directory and key."""
        for proc in list(self.procs):
            if proc not in self.procs or proc.popen.poll() is None:
                continue  # (a process replaced by a restart earlier in this loop)
            node = next((n for n in self.started_nodes.values() if proc in n.procs), None)
            if node is None or not self.restart_nodes or free_mb(self.workdir) < 1:
                raise proc.failure()  # (a node restarted on a full disk would die again)
            self._revive(node, proc)

    def disk_full(self) -> str | None:
        """Which process's log says, since the last call, that the disk is full (Flower's
        SuperLink: `database or disk is full`; any Python process: `No space left on
        device`), in words; None when none does. Reads only what the logs gained."""
        for proc in [*self.procs, *self.workers]:
            path = proc.log_path
            start, carry = self._log_read.get(path, (0, b""))
            try:
                with open(path, "rb") as fh:
                    fh.seek(start)
                    news = fh.read()
            except OSError:
                continue
            self._log_read[path] = (start + len(news), news[-64:])  # a sign cut in two
            if news and no_space((carry + news).decode(errors="replace")):
                return f"{proc.name} could not write (its log: {path})"
        return None

    def _revive(self, node: Node, dead: Proc) -> None:
        now = time.monotonic()
        if node.died_at is None:  # just noticed: stop what is left of it, wait the backoff
            node.died_at, node.exit_code = now, dead.popen.returncode
            for proc in node.procs:
                if proc.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.popen.pid, signal.SIGKILL)
                    proc.popen.wait(timeout=10)
            print(
                f"SuperNode of client {node.partition_id} exited (code {node.exit_code}); "
                f"restarting it",
                flush=True,
            )
            return
        if node.restarts >= NODE_RESTART_LIMIT:
            raise LaunchError(
                f"SuperNode of client {node.partition_id} exited {node.restarts + 1} times "
                f"(last code {node.exit_code}); gave up restarting it:\n{dead.tail()}"
            )
        wait = NODE_RESTART_BACKOFF[min(node.restarts, len(NODE_RESTART_BACKOFF) - 1)]
        if now - node.died_at < wait:
            return
        for proc in node.procs:
            self.procs.remove(proc)
        node.procs = node.launch()
        node.restarts += 1
        record = {
            rundir.Event.KEY: rundir.Event.NODE_RESTARTED,
            "client": node.partition_id,
            "restart": node.restarts,
            "exit-code": node.exit_code,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        node.died_at = node.exit_code = None
        self.restart_log.append(record)
        if self.events is not None:
            line = (json.dumps(record) + "\n").encode()
            fd = os.open(self.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one write: lines the server appends stay whole
            finally:
                os.close(fd)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM each process, workers included (SuperNodes deregister), then SIGKILL
        whatever is left."""
        self.procs.extend(self.workers)
        self.workers.clear()
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGKILL)  # children (superexec, apps) too
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)
        self.procs.clear()

    def lost_messages(self) -> str:
        """One sentence on what Flower's processes here logged about messages they could not
        deliver (the SuperLink's SQLite "database is locked", a SuperNode's "Failed to send
        message"); empty when they logged none."""
        parts = []
        locked = _count_in(self.workdir / "superlink.log", "database is locked")
        if locked:
            parts.append(
                f"the SuperLink logged {locked} 'database is locked' error(s) "
                f"({self.workdir / 'superlink.log'})"
            )
        unsent = sorted(
            i
            for i in self.started_nodes
            if _count_in(self.workdir / f"supernode-{i}.log", "Failed to send message")
        )
        if unsent:
            shown = ", ".join(map(str, unsent))
            parts.append(f"the SuperNodes of client(s) {shown} failed to send a reply")
        return "; ".join(parts)


def _count_in(log: Path, text: str) -> int:
    """How many lines of `log` contain `text` (0 for a log that cannot be read)."""
    try:
        with open(log, errors="replace") as fh:
            return sum(text in line for line in fh)
    except OSError:
        return 0
