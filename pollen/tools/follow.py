"""Following a submitted run: its progress from the results directory, the federation's
processes, and its status from the `flwr` CLI, until it finishes or must be stopped."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pollen.core import rundir
from pollen.tools.local_federation import LocalFederation
from pollen.tools.processes import DiskFull, LaunchError
from pollen.tools.progress import Progress, Sink

START_TIMEOUT = 300.0
"""Seconds a submitted run's ServerApp may take to write its first event before the run is
stopped (`--start-timeout`): on a loaded 2-core machine it starts in well under a minute; a
ServerApp that cannot start (no SuperExec serving the SuperLink, a full disk, a crashed child)
never does."""


STATUS_POLL_MIN = 3.0
STATUS_POLL_MAX = 15.0
STATUS_POLL_ENDING = 1.0  # once the summary is written: the ServerApp is exiting


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def follow(
    fed: LocalFederation,
    run_id: str,
    out_dir: Path,
    timeout: float,
    stream: TextIO = sys.stdout,
    num_rounds: int = 0,
    history: bool = False,
    plain: bool | None = None,
    sinks: Sequence[Sink] = (),
    start_timeout: float = START_TIMEOUT,
) -> dict[str, Any]:
    """Show progress until the run finishes; returns its final status record. The run is
    stopped (LaunchError) when its ServerApp has not started after `start_timeout` seconds, or
    when a process of the federation logs a full disk (DiskFull).

    Each status query is a `flwr ls` process (0.6-1.8 CPU-seconds of imports on a 2-core
    machine, taken from the run itself), so the run's status is asked at once when the server
    writes its summary.json (at the end of a run, also a failed one) and otherwise at intervals
    growing from STATUS_POLL_MIN to STATUS_POLL_MAX seconds, and only once the run has written
    nothing new for that long: a ServerApp that is writing rounds is alive, and one that dies
    without writing a summary is still noticed that long after its last line. Flower marks the
    run finished only once the ServerApp process has exited, a second or so after the summary,
    so from the summary on the status is asked every STATUS_POLL_ENDING seconds. `plain`: the
    view (pollen.tools.progress; None: plain unless `stream` is a terminal); `sinks` follow the
    results too (TensorBoard)."""
    progress = Progress(
        out_dir, stream, num_rounds, history, plain=plain, clock=time.monotonic, sinks=sinks
    )
    try:
        return _follow(fed, run_id, out_dir, timeout, progress, start_timeout)
    finally:
        progress.close()


class _StatusQuery(threading.Thread):
    """One `flwr ls` in the background, so that progress keeps moving while it runs (a second
    on an idle machine, much longer on a loaded one). A daemon: Ctrl-C never waits for it."""

    def __init__(self, fed: LocalFederation, run_id: str) -> None:
        super().__init__(daemon=True)
        self.fed, self.run_id = fed, run_id
        self.status: dict[str, Any] = {}
        self.start()

    def run(self) -> None:
        self.status = self.fed.run_status(self.run_id)


def _follow(
    fed: LocalFederation,
    run_id: str,
    out_dir: Path,
    timeout: float,
    progress: Progress,
    start_timeout: float = START_TIMEOUT,
) -> dict[str, Any]:
    t0 = time.monotonic()
    deadline = t0 + timeout
    summary = out_dir / rundir.SUMMARY
    summary_seen = before = _mtime(summary)  # a resumed run's directory may hold an old one
    interval = STATUS_POLL_MIN
    next_status = time.monotonic()
    query: _StatusQuery | None = None
    while True:
        progress.poll()
        fed.check_alive()
        full = fed.disk_full()
        if full is not None:
            fed.stop_run(run_id)
            raise DiskFull(full)
        if progress.state.doing == "start" and time.monotonic() - t0 > start_timeout:
            fed.stop_run(run_id)
            log = fed.workdir / "superlink.log"
            where = str(log) if log.exists() else "on the SuperLink's machine"
            raise LaunchError(
                f"run {run_id}: its ServerApp wrote nothing to {out_dir} within "
                f"{start_timeout:g} s of the submission (--start-timeout), so it never started "
                "(a SuperLink with no SuperExec to run it, or Flower's processes failing: "
                f"the SuperLink's log {where} says which); stopped the run"
            )
        written = _mtime(summary)
        now = time.monotonic()
        quiet = interval
        if progress.news_at is not None and summary_seen == before:  # not yet ending
            quiet = now - progress.news_at
        due = now >= next_status and quiet >= interval  # nothing new for as long: ask Flower
        if query is None and (written != summary_seen or due):
            summary_seen = written
            query = _StatusQuery(fed, run_id)
        if query is not None:
            query.join(timeout=0.1)
            if not query.is_alive():
                status, query = query.status, None
                if str(status.get("status", "")).startswith("finished"):
                    return status
                if summary_seen != before:  # written by this run: it is ending, ask again soon
                    next_status = time.monotonic() + STATUS_POLL_ENDING
                else:
                    next_status = time.monotonic() + interval
                    interval = min(interval * 1.5, STATUS_POLL_MAX)
        if time.monotonic() > deadline:
            fed.stop_run(run_id)
            raise LaunchError(f"run {run_id} did not finish within {timeout:g} s; stopped it")
        time.sleep(0.5)
