"""A disk that fills up, on a small tmpfs, as `pollen simulate` runs: one line naming the cause,
every process stopped, the last checkpoint readable, and `--resume` finishing the run once space
is freed. Skipped, with the reason, where mounting a tmpfs is not permitted."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pollen.core.rundir import read_jsonl
from server import checkpoint
from tests.pollen.test_cli_e2e import POLLEN, _processes_under

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SIM = ["simulate", "--dataset", "digits", "--clients", "2", "--plain"]
ROUNDS = 10
"""Rounds of the run the disk fills under: enough that it is still running when the filler,
started by round 1's checkpoint, has filled the disk (a round of 2 clients takes 0.2 s)."""


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 80 MB filesystem of its own (a run needs 64 MB free to start)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "tmpfs", str(mount)],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.decode().strip()})")
    yield mount
    deadline = time.monotonic() + 30
    while _processes_under(mount) and time.monotonic() < deadline:
        time.sleep(0.5)
    subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def _fill_when(trigger: Path, filler: Path, stop: threading.Event) -> threading.Thread:
    """Once `trigger` exists, write zeros to `filler` until the disk is full."""

    def fill() -> None:
        while not trigger.exists():
            if stop.wait(0.1):
                return
        with open(filler, "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 2**20)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC

    thread = threading.Thread(target=fill, daemon=True)
    thread.start()
    return thread


def _pollen(args: list[str], cache: Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, POLLEN_CACHE_DIR=str(cache), FLWR_TELEMETRY_ENABLED="0")
    return subprocess.run([*POLLEN, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)  # fmt: skip


def _left_behind(directory: Path, grace: float = 30.0) -> list[str]:
    """Processes of the run still alive `grace` seconds after the command returned: Ray's
    actors exit on their own shortly after the launcher stopped their runtime (as in
    tests/pollen/test_cli_e2e.py's teardown test)."""
    deadline = time.monotonic() + grace
    while _processes_under(directory) and time.monotonic() < deadline:
        time.sleep(1)
    return _processes_under(directory)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("pollen: error:")]


def test_a_disk_that_fills_as_the_run_starts_stops_it_with_the_reason(
    disk: Path, shared_cache: Path
) -> None:
    out = disk / "run"
    stop = threading.Event()
    _fill_when(out / "processes" / "superlink.log", disk / "filler", stop)
    t0 = time.monotonic()
    try:
        done = _pollen([*SIM, "--rounds", "2", "--out", str(out)], shared_cache)
    finally:
        stop.set()
    took = time.monotonic() - t0
    assert done.returncode != 0, done.stdout + done.stderr
    [line] = _error_lines(done.stderr)
    assert "no space left on device in " + str(out) in line, line
    assert "Traceback" not in done.stderr
    assert took < 300, took  # before: "waiting for the ServerApp to start" without end
    assert _left_behind(out) == []


def test_a_disk_full_mid_run_keeps_the_checkpoint_and_resume_finishes_the_run(
    disk: Path, shared_cache: Path
) -> None:
    out = disk / "run"
    filler = disk / "filler"
    stop = threading.Event()
    _fill_when(out / "checkpoint" / "state.json", filler, stop)  # once round 1 is saved
    try:
        done = _pollen([*SIM, "--rounds", str(ROUNDS), "--out", str(out)], shared_cache)
    finally:
        stop.set()
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = _error_lines(done.stderr)
    saved = checkpoint.load(out)  # whole and readable
    assert 1 <= saved.server_round < ROUNDS
    assert f"no space left on device in {out}" in line, line
    assert f"its checkpoint of round {saved.server_round} is kept" in line, line
    assert f"--resume --out {out}" in line, line
    assert _left_behind(out) == []
    for name in ("metrics.jsonl", "clients.jsonl", "events.jsonl"):  # whole lines only
        text = (out / name).read_text()
        assert text.endswith("\n") and all(json.loads(r) for r in text.splitlines()), name

    filler.unlink()  # space freed
    done = _pollen(["simulate", "--resume", "--out", str(out), "--plain"], shared_cache)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [r["round"] for r in read_jsonl(out / "metrics.jsonl")] == list(range(1, ROUNDS + 1))
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"

    # a full disk before a resume with more rounds: refused before anything starts, the
    # completed run's files byte for byte as they were
    def digests() -> dict[str, str]:
        files = [p for p in sorted(out.rglob("*")) if p.is_file() and "processes" not in p.parts]
        return {str(p.relative_to(out)): hashlib.md5(p.read_bytes()).hexdigest() for p in files}

    before = digests()
    stop = threading.Event()
    _fill_when(out, filler, stop).join(timeout=60)
    more = str(ROUNDS + 1)
    done = _pollen(["simulate", "--resume", "--out", str(out), "--rounds", more], shared_cache)
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = _error_lines(done.stderr)
    assert "no space left on device" in line
    assert digests() == before
