"""A ServerApp process that must not outlive what started it: Pollen's own ServerApp and a
Flower app's `pollen.flower` strategy watch their parent and the `pollen` launcher, and exit with
every process they started once either is gone."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pollen.core.contracts.launcher import LAUNCHER_PID

WATCHED = ("flwr-serverapp", "flwr-simulation")
"""The processes this ServerApp runs in that must not outlive their parent (deployment,
simulation); the in-process runs of tests are not watched."""
log = logging.getLogger("flwr.pollen")


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Every live process below `pid`, from the parent links in /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def launcher_alive(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the `pollen` launcher that started this run (if one did) still runs."""
    pid = environ.get(LAUNCHER_PID, "")
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def exit_with_parent(
    getppid: Callable[[], int] = os.getppid,
    exit_: Callable[[int], None] = os._exit,
    sleep: Callable[[float], None] = time.sleep,
    below: Callable[[], list[int]] = lambda: descendants(os.getpid()),
    kill: Callable[[int], None] = _kill,
    launcher: Callable[[], bool] = launcher_alive,
) -> None:
    """Exits once the process that started this one, or the `pollen` launcher, is gone, and
    takes every process it started along. A `flwr-serverapp` whose SuperLink and SuperExec were
    killed otherwise lives on for minutes, retrying, and could write into the run directory
    while a resumed run uses it; a `flwr-simulation` lives on running its Ray cluster (Ray's
    head processes die with it, but not the agents and workers below its raylet). The launcher
    is watched too because it may be gone before this starts, and then the parent seen here is
    already the one this process was re-parented to. Files are written atomically: a stop here
    leaves the last complete checkpoint."""
    parent = getppid()
    while getppid() == parent and launcher():
        sleep(2.0)
    left = below()  # collected before any dies: orphans lose their link to this process
    log.error(
        "the launcher or the process that started this ServerApp (pid %s) is gone; exiting "
        "with the %d processes it started",
        parent,
        len(left),
    )
    for pid in left:
        kill(pid)
    exit_(1)


_watching = False


def watch_parent() -> None:
    """Start `exit_with_parent` in a daemon thread, once per process, when this process is a
    `flwr-serverapp` or `flwr-simulation` (not when a test drives an app in-process)."""
    global _watching
    if _watching or os.path.basename(sys.argv[0]) not in WATCHED:
        return
    _watching = True
    threading.Thread(target=exit_with_parent, daemon=True).start()
