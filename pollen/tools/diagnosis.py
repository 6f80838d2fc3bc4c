"""What Flower's processes say when they fail for a reason the operator can fix, in one line.

Flower's SuperLink reports a taken port as a Python traceback ending in `SystemExit`, an
unwritable database as a 130-line SQLAlchemy traceback, a full disk as `database or disk is
full` on every call; `known_cause` turns the output of such a process into the line
`pollen: error:` prints, and `ConsoleCopy` passes a foreground process's output on while
holding back a traceback until it is known whether the process dies of it."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import TextIO

ANSI = re.compile(r"\x1b\[[0-9;]*m")

NO_SPACE_SIGNS = ("No space left on device", "database or disk is full", "[Errno 28]")
"""How a full disk shows in the logs of Flower's processes and of Python (ENOSPC)."""

_GRPC_PORT = re.compile(r"Port in server address ([^\s{}]+) is already in use")
_HTTP_PORT = re.compile(r"error while attempting to bind on address \('([^']*)', (\d+)\)")


def no_space(text: str) -> bool:
    """The text reports a full disk."""
    return any(sign in text for sign in NO_SPACE_SIGNS)


def known_cause(lines: Sequence[str]) -> str | None:
    """One line naming the cause of a failure that `lines` (a process's output) show, or None
    when they show none that is known."""
    text = ANSI.sub("", "".join(lines))
    grpc = _GRPC_PORT.search(text)
    if grpc:
        return (
            f"the Fleet API address {grpc.group(1)} is already in use by another program (taken "
            "after the check before start-up: a second server starting at the same time?); "
            "stop it or choose another --fleet-port"
        )
    http = _HTTP_PORT.search(text)
    if http and "address already in use" in text:
        return (
            f"the HTTP API address {http.group(1)}:{http.group(2)} is already in use by another "
            "program (taken after the check before start-up); stop it or choose another --port"
        )
    if no_space(text):
        return "no space left on device (the SuperLink could not write its database)"
    if "unable to open database file" in text:
        return "SQLite cannot open the database file (--database): its directory is not writable"
    if "file is not a database" in text:
        return "the --database file is not an SQLite database"
    return None


class ConsoleCopy:
    """Copies a child's output (its stdout, with stderr merged) to `stream` line by line, in a
    thread. A Python traceback is held back from its first line on: shown as soon as the
    process logs anything else (it lived on), or by `held` once it exited; the last lines are
    kept for `known_cause`."""

    TAIL = 200

    def __init__(self, popen: subprocess.Popen[bytes], stream: TextIO | None = None) -> None:
        self.popen = popen
        self.stream = stream if stream is not None else sys.stdout  # (this one, at the call)
        self.tail: list[str] = []
        self._held: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._copy, daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.decode(errors="replace")
            with self._lock:
                self.tail.append(line)
                del self.tail[: -self.TAIL]
                if self._held or "Traceback (most recent call last)" in line:
                    if self._held and _log_line(line):  # the process went on: show it all
                        self._write([*self._held, line])
                        self._held = []
                    else:
                        self._held.append(line)
                    continue
                self._write([line])

    def _write(self, lines: Sequence[str]) -> None:
        try:
            self.stream.write("".join(lines))
            self.stream.flush()
        except (OSError, ValueError):
            pass  # the reader went away; the process runs on

    def finish(self, timeout: float = 10.0) -> list[str]:
        """After the process exited: wait for its last output; the lines held back."""
        self._thread.join(timeout=timeout)
        with self._lock:
            held, self._held = self._held, []
        return held

    def show(self, lines: Sequence[str]) -> None:
        """Pass on lines `finish` held back (an unknown failure: the operator needs them)."""
        with self._lock:
            self._write(lines)


def _log_line(line: str) -> bool:
    """A line Flower's logger (or uvicorn's) wrote, rather than a traceback's continuation."""
    text = ANSI.sub("", line)
    return bool(re.match(r"(INFO|WARNING|DEBUG) *:|\d{4}-\d\d-\d\dT[\d:.]+Z (INFO|WARNING)", text))
