from __future__ import annotations

import os
import subprocess
import sys
import time

from pollen.core.contracts.launcher import LAUNCHER_PID
from server.lifeline import descendants, exit_with_parent, launcher_alive


def test_the_server_app_exits_once_its_parent_is_gone_with_what_it_started() -> None:
    parents = iter([10, 10, 10, 1])  # the parent dies: the process is re-parented to init
    events: list[str] = []
    naps: list[float] = []
    exit_with_parent(
        getppid=lambda: next(parents),
        exit_=lambda code: events.append(f"exit {code}"),
        sleep=naps.append,
        below=lambda: [21, 22],
        kill=lambda pid: events.append(f"kill {pid}"),
    )
    assert events == ["kill 21", "kill 22", "exit 1"] and len(naps) == 2


def test_the_server_app_exits_once_the_launcher_is_gone() -> None:
    """Also when the launcher died before the ServerApp started: its parent is then already
    the process it was re-parented to, and never changes."""
    launcher = iter([True, True, False])
    exits: list[int] = []
    exit_with_parent(
        getppid=lambda: 1,
        exit_=exits.append,
        sleep=lambda s: None,
        below=list,
        kill=lambda pid: None,
        launcher=lambda: next(launcher),
    )
    assert exits == [1]
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not launcher_alive({LAUNCHER_PID: str(gone.pid)})
    assert launcher_alive({LAUNCHER_PID: str(os.getpid())}) and launcher_alive({})


def test_descendants_include_grandchildren() -> None:
    """What a `flwr-simulation` leaves when it exits: Ray's agents below its raylet."""
    script = "import subprocess, sys, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120  # the child's interpreter starts slowly on a busy machine
        while not descendants(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchildren = descendants(child.pid)
        below = descendants(os.getpid())
        assert len(grandchildren) == 1
        assert {child.pid, *grandchildren} <= set(below)
    finally:
        for pid in descendants(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()
