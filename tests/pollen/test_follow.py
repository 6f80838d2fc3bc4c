"""Following a run (pollen.tools.follow), on virtual time with a stand-in federation: when the
run's status is asked, and when the run is stopped (a ServerApp that never starts, a full disk)."""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from pollen.tools import follow as following
from pollen.tools.processes import DiskFull, LaunchError


class _Clock:
    """Virtual time for follow(): sleep advances it, and a callback runs at each step."""

    def __init__(self, on_tick: Callable[[float], None]) -> None:
        self.now = 0.0
        self.on_tick = on_tick

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_tick(self.now)


class _Federation:
    def __init__(self, clock: _Clock, finished_at: float) -> None:
        self.clock = clock
        self.finished_at = finished_at
        self.queries: list[float] = []
        self.stopped = []
        self.workdir = Path("/nonexistent")

    full_at: float | None = None
    stopped: list[str]

    def check_alive(self) -> None:
        pass

    def disk_full(self) -> str | None:
        if self.full_at is not None and self.clock.now >= self.full_at:
            return "superlink could not write"
        return None

    def stop_run(self, run_id: str) -> None:
        self.stopped.append(run_id)

    def run_status(self, run_id: str) -> dict[str, str]:
        self.queries.append(self.clock.now)
        done = self.clock.now >= self.finished_at
        return {"status": "finished:completed" if done else "running"}


def _follow(
    tmp_path: Path,
    finished_at: float,
    summary_at: float | None,
    monkeypatch,
    full_at: float | None = None,
    start_timeout: float = 300.0,
    fed_out: list | None = None,
    writes: Callable[[float], None] | None = None,
) -> tuple:
    def tick(now: float) -> None:
        if writes is not None:
            writes(now)
        if (
            summary_at is not None
            and now >= summary_at
            and not (tmp_path / "summary.json").exists()
        ):
            (tmp_path / "summary.json").write_text("{}")

    clock = _Clock(tick)
    monkeypatch.setattr(following, "time", clock)
    fed = _Federation(clock, finished_at)
    fed.full_at = full_at
    if fed_out is not None:
        fed_out.append(fed)
    status = following.follow(fed, "1", tmp_path, timeout=1000, stream=io.StringIO(),  # type: ignore[arg-type]
                              start_timeout=start_timeout)  # fmt: skip
    return status, fed.queries, clock.now


def test_follow_stops_a_run_whose_serverapp_never_starts(tmp_path: Path, monkeypatch) -> None:
    """Nothing in the results directory `start_timeout` seconds after the submission: the run
    is stopped with one line, instead of "waiting for the ServerApp to start" for ever."""
    feds: list = []
    says = r"wrote nothing to .* within 60 s of the submission \(--start-timeout\)"
    with pytest.raises(LaunchError, match=says) as info:
        _follow(tmp_path, finished_at=1e9, summary_at=None, monkeypatch=monkeypatch,
                start_timeout=60.0, fed_out=feds)  # fmt: skip
    assert not isinstance(info.value, DiskFull)
    assert feds[0].stopped == ["1"]
    assert 60.0 < feds[0].clock.now < 62.0


def test_follow_lets_a_started_serverapp_run_past_the_start_timeout(
    tmp_path: Path, monkeypatch
) -> None:
    (tmp_path / "events.jsonl").write_text('{"event": "round-start", "round": 1, "rounds": 2}\n')
    status, _, ended = _follow(tmp_path, finished_at=100.0, summary_at=None,
                               monkeypatch=monkeypatch, start_timeout=30.0)  # fmt: skip
    assert status["status"] == "finished:completed" and ended >= 100.0


def test_follow_stops_the_run_when_a_process_logs_a_full_disk(tmp_path: Path, monkeypatch) -> None:
    feds: list = []
    with pytest.raises(DiskFull, match="superlink could not write"):
        _follow(tmp_path, finished_at=1e9, summary_at=None, monkeypatch=monkeypatch,
                full_at=20.0, fed_out=feds)  # fmt: skip
    assert feds[0].stopped == ["1"] and 20.0 <= feds[0].clock.now < 21.0


def test_follow_asks_for_the_status_at_once_when_the_summary_is_written(
    tmp_path: Path, monkeypatch
) -> None:
    status, queries, ended = _follow(
        tmp_path, finished_at=100.0, summary_at=100.0, monkeypatch=monkeypatch
    )
    assert status["status"] == "finished:completed"
    assert ended <= 100.5  # noticed at the first poll after the summary, not at the next interval
    # `flwr ls` processes are spaced out: at most one per 3 s at first, then one per 15 s
    assert len(queries) <= 12
    gaps = [b - a for a, b in itertools.pairwise(queries)]
    assert min(gaps) >= 3.0
    assert max(gaps[:-1]) <= 15.5


def test_follow_asks_again_soon_when_the_run_ends_after_its_summary(
    tmp_path: Path, monkeypatch
) -> None:
    """Flower reports the run finished once the ServerApp has exited, after the summary: the
    status is asked every STATUS_POLL_ENDING seconds from the summary on, not at the grown
    interval (up to 15 s)."""
    status, queries, ended = _follow(
        tmp_path, finished_at=101.2, summary_at=100.0, monkeypatch=monkeypatch
    )
    assert status["status"] == "finished:completed"
    assert ended <= 101.2 + following.STATUS_POLL_ENDING + 0.6
    after = [q for q in queries if q >= 100.0]
    assert len(after) >= 2 and all(b - a >= 1.0 for a, b in itertools.pairwise(after))


def test_an_old_summary_does_not_make_follow_ask_every_second(
    tmp_path: Path, monkeypatch
) -> None:
    """A resumed run's directory holds the summary of the attempt before: the status is still
    asked at the growing interval until this run writes its own."""
    (tmp_path / "summary.json").write_text("{}")
    status, queries, ended = _follow(
        tmp_path, finished_at=60.0, summary_at=None, monkeypatch=monkeypatch
    )
    assert status["status"] == "finished:completed"
    assert 60.0 <= ended <= 60.0 + 15.5
    assert len(queries) <= 8
    assert min(b - a for a, b in itertools.pairwise(queries)) >= 3.0


def test_follow_notices_a_run_that_ends_without_a_summary(tmp_path: Path, monkeypatch) -> None:
    status, _queries, ended = _follow(
        tmp_path, finished_at=60.0, summary_at=None, monkeypatch=monkeypatch
    )
    assert status["status"] == "finished:completed"
    assert 60.0 <= ended <= 60.0 + 15.5


def _rounds_written(tmp_path: Path, start: float, stop: float, every: float):
    """A ServerApp that writes a round's event every `every` seconds from `start` to `stop`."""
    written: list[float] = []

    def writes(now: float) -> None:
        if start <= now <= stop and (not written or now - written[-1] >= every):
            written.append(now)
            with (tmp_path / "events.jsonl").open("a") as f:
                f.write(f'{{"event": "round-start", "round": {len(written)}, "rounds": 1000}}\n')

    return writes


def test_follow_does_not_ask_for_the_status_while_the_run_writes_rounds(
    tmp_path: Path, monkeypatch
) -> None:
    """Each `flwr ls` costs the machine 0.6-1.8 CPU-seconds: while the ServerApp writes a round
    every 5 s, the status is not asked between its first rounds and its summary."""
    status, queries, ended = _follow(
        tmp_path, finished_at=300.0, summary_at=300.0, monkeypatch=monkeypatch,
        writes=_rounds_written(tmp_path, 10.0, 300.0, 5.0),
    )  # fmt: skip
    assert status["status"] == "finished:completed" and ended <= 300.5
    assert queries and min(queries) < 10.0  # asked before the first round, as before
    assert [q for q in queries if 30.0 < q < 300.0] == []


def test_follow_notices_a_run_that_stops_writing_and_ends_without_a_summary(
    tmp_path: Path, monkeypatch
) -> None:
    """The ServerApp writes rounds until t=100 and dies there without a summary: the status is
    asked once the run has been quiet for the poll interval, and the end is noticed."""
    status, queries, ended = _follow(
        tmp_path, finished_at=100.0, summary_at=None, monkeypatch=monkeypatch,
        writes=_rounds_written(tmp_path, 10.0, 100.0, 5.0),
    )  # fmt: skip
    assert status["status"] == "finished:completed"
    assert 100.0 <= ended <= 100.0 + following.STATUS_POLL_MAX + 0.6
    assert [q for q in queries if 30.0 < q < 100.0] == []
