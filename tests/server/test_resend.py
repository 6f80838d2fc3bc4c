"""A reply lost on its way (the client ran the handler, the SuperLink did not keep the reply, as
with its "database is locked") costs a resend deadline, not the phase timeout: the engine sends
the instruction again, the client answers it again from the same stored state, and the run ends
where the run without the loss ends. A reply that arrives twice is used once. A node that never
answers its hello is given up after its resends, and the run starts without it, saying so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, RecordDict

from client.app import app as client_app
from pollen.core.rundir import read_jsonl
from server import exchange
from server.engine import Engine, PhaseFailed
from server.resend import RESEND_FLOOR, Sends, resend_after
from server.results import ResultsWriter
from strategies.fedavg import FedAvg
from tests.fakes import FakeClock, FakeGrid, settings_of
from tests.server.test_bad_replies import METRIC_TOL, ROUNDS, TOL, _run, _settings, _untimed

LONG_TIMEOUT = 600.0


def _lost_once(phase_of_round: list[str]) -> Any:
    """Client 0's reply to round k's k-th phase is lost the first time it is sent."""
    lost: set[tuple[str, str]] = set()

    def fault(_engine: Any, node: int, msg: Message) -> str | None:
        rnd, kind = msg.metadata.group_id, msg.metadata.message_type
        target = phase_of_round[min(int(rnd), len(phase_of_round)) - 1]
        if node != 100 or kind != target or (rnd, kind) in lost:
            return None
        lost.add((rnd, kind))
        return "lost"

    return fault


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ROUNDS))
def test_a_lost_reply_is_asked_again_and_the_run_ends_as_without_the_loss(
    run_config: dict[str, Any], algorithm: str
) -> None:
    """Every phase of every algorithm is safe to repeat: client 0 ran the handler once already
    (its state for the round is written) and answers the resent instruction with the reply it
    would have given, so the strategy state and metrics equal the run without the loss."""
    phases = ROUNDS[algorithm][1]
    base = {**run_config, "phase-timeout": LONG_TIMEOUT}
    ref_cfg = _settings(base, algorithm, "undisturbed")
    lossy_cfg = _settings(base, algorithm, "lossy")
    ref, ref_summary = _run(ref_cfg, lambda *_: None)
    lossy, lossy_summary = _run(lossy_cfg, _lost_once(phases))
    assert ref_summary["status"] == lossy_summary["status"] == "completed"

    grid = lossy.grid
    assert isinstance(grid, FakeGrid)
    assert grid.lost == [(100, p) for p in phases]  # the handler ran and its reply was lost
    rows = read_jsonl(Path(lossy_cfg["out-dir"]) / "metrics.jsonl")
    for rnd, row in enumerate(rows, start=1):
        report = next(p for p in row["phases"] if p["phase"] == phases[rnd - 1])
        assert report["resent"] == {"0": 1} and not report["failed"]
        assert report["valid"] == report["sent"]
        # it cost the resend deadline, not the phase timeout
        assert RESEND_FLOOR <= report["seconds"] < 2 * RESEND_FLOOR
    ref_arrays, ref_meta = ref.strategy.state()
    arrays, meta = lossy.strategy.state()
    assert meta == ref_meta and set(arrays) == set(ref_arrays)
    for key, value in ref_arrays.items():
        np.testing.assert_allclose(arrays[key], value, rtol=TOL, atol=TOL, err_msg=key)
    ref_rows = read_jsonl(Path(ref_cfg["out-dir"]) / "metrics.jsonl")
    for row, ref_row in zip(rows, ref_rows, strict=True):
        want = _untimed(ref_row["train"])
        assert _untimed(row["train"]) == pytest.approx(want, rel=METRIC_TOL, abs=METRIC_TOL)


def _engine(cfg: dict[str, Any], grid: FakeGrid) -> tuple[Engine, FakeClock]:
    clock = FakeClock()
    writer = ResultsWriter(cfg["out-dir"])
    return Engine(grid, cfg, FedAvg(cfg), writer, clock=clock, sleep=clock.sleep), clock


def test_a_lost_hello_costs_the_resend_deadline_and_a_double_reply_counts_once(
    run_config: dict[str, Any],
) -> None:
    """Node 102's first hello reply is lost; in round 2 node 101's first train reply comes
    late, together with the reply to its resent instruction: one of the two is used."""
    cfg = settings_of({**run_config, "num-clients": 4, "min-available-clients": 4,
                       "num-rounds": 2, "final-eval": False, "server-eval": False,
                       "phase-timeout": LONG_TIMEOUT})  # fmt: skip
    grid = FakeGrid(client_app, 4, cfg)
    grid.leaky = True  # the grid even hands over replies nobody asked for
    first: set[tuple[int, str, str]] = set()

    def fault(node: int, msg: Message, _: Any) -> str | None:
        key = (node, msg.metadata.group_id, msg.metadata.message_type)
        if key in first:
            return None
        first.add(key)
        if key == (102, "1", "query.hello"):
            return "lost"
        return "late" if key == (101, "2", "train") else None

    grid.faults.append(fault)
    engine, _ = _engine(cfg, grid)
    summary = engine.run()
    assert summary["status"] == "completed" and summary["clients"] == [0, 1, 2, 3]
    events = read_jsonl(Path(cfg["out-dir"]) / "events.jsonl")
    hello = next(e for e in events if e["event"] == "phase-end")
    assert hello["phase"] == "query.hello" and hello["resent"] == {"102": 1}
    assert RESEND_FLOOR <= hello["seconds"] < 2 * RESEND_FLOOR
    assert not any(e["event"] == "clients-missing" for e in events)
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    train = rows[1]["phases"][-1]
    assert train["resent"] == {"1": 1} and train["valid"] == train["sent"] == 4
    assert rows[1]["train"]["clients"] == 4.0  # client 1 counted once
    replies = read_jsonl(Path(cfg["out-dir"]) / "clients.jsonl")
    assert sorted(r["client-id"] for r in replies if r["round"] == 2) == [0, 1, 2, 3]
    assert [t for n, t in grid.sent if n == 101].count("train") == 3  # rounds 1, 2 and resend


def test_the_run_ends_as_without_a_doubled_reply(run_config: dict[str, Any]) -> None:
    """The doubled reply of the test above changes nothing: same model as without it."""

    def run(late: bool, tag: str) -> dict[str, np.ndarray]:
        cfg = settings_of({**run_config, "num-rounds": 2, "final-eval": False,
                           "server-eval": False, "phase-timeout": LONG_TIMEOUT,
                           "out-dir": f"{run_config['out-dir']}-{tag}"})  # fmt: skip
        grid = FakeGrid(client_app, 3, cfg)
        grid.leaky = True
        done: set[str] = set()

        def fault(node: int, msg: Message, _: Any) -> str | None:
            if late and node == 101 and msg.metadata.group_id == "2" and "x" not in done:
                done.add("x")
                return "late"
            return None

        grid.faults.append(fault)
        engine, _ = _engine(cfg, grid)
        assert engine.run()["status"] == "completed"
        return dict(engine.strategy.state()[0])

    doubled, alone = run(True, "doubled"), run(False, "alone")
    assert doubled.keys() == alone.keys()
    for key in alone:
        np.testing.assert_allclose(doubled[key], alone[key], rtol=1e-6, atol=1e-7)


def test_a_node_that_never_answers_its_hello_is_given_up_and_named(
    run_config: dict[str, Any],
) -> None:
    """Node 102 is online but every hello reply of it is lost: after resend-limit resends the
    run starts with the others (not after wait-for-clients), one event naming what is missing;
    when every client is required, the failure says the same."""
    base = {**run_config, "num-clients": 4, "num-rounds": 1, "final-eval": False,
            "server-eval": False, "phase-timeout": LONG_TIMEOUT,
            "wait-for-clients": 3000.0}  # fmt: skip

    def grid_for(cfg: dict[str, Any]) -> FakeGrid:
        grid = FakeGrid(client_app, 4, cfg)
        grid.faults.append(
            lambda node, msg, _: "lost" if (node, msg.metadata.message_type) == (
                102, "query.hello") else None
        )  # fmt: skip
        return grid

    cfg = settings_of(base)
    grid = grid_for(cfg)
    engine, clock = _engine(cfg, grid)
    summary = engine.run()
    assert summary["status"] == "completed" and summary["clients"] == [0, 1, 3]
    limit = int(cfg["resend-limit"])
    assert grid.lost.count((102, "query.hello")) == 1 + limit  # the first round's hello only
    assert clock.now < cfg["wait-for-clients"] / 10
    events = read_jsonl(Path(cfg["out-dir"]) / "events.jsonl")
    (missing,) = [e for e in events if e["event"] == "clients-missing"]
    assert missing["missing"] == [2] and missing["connected"] == 3 and missing["total"] == 4
    assert "node 102 asked 3 times" in missing["reason"]
    hello = next(e for e in events if e["event"] == "phase-end")
    assert hello["failed"]["102"].startswith(f"no reply to {1 + limit} hellos in")

    strict = settings_of({**base, "min-available-clients": 4, "wait-for-clients": 60.0,
                          "out-dir": f"{run_config['out-dir']}-strict"})  # fmt: skip
    engine, _ = _engine(strict, grid_for(strict))
    with pytest.raises(PhaseFailed) as failed:
        engine.run()
    text = str(failed.value)
    assert "only 3 of the 4 required clients connected within 60 s" in text
    assert "missing: client(s) 2" in text and "never answered the hello" in text


def test_without_resends_a_lost_reply_waits_out_the_phase(run_config: dict[str, Any]) -> None:
    cfg = settings_of({**run_config, "num-rounds": 1, "final-eval": False, "server-eval": False,
                       "resend-limit": 0})  # fmt: skip
    grid = FakeGrid(client_app, 3, cfg)
    grid.faults.append(
        lambda node, msg, _: "lost" if (node, msg.metadata.message_type) == (101, "train") else None
    )
    engine, _ = _engine(cfg, grid)
    assert engine.run()["status"] == "completed"
    row = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]
    assert row["phases"][-1]["failed"] == {"1": "no reply within 30 s"}
    assert "resent" not in row["phases"][-1]
    assert [t for n, t in grid.sent if n == 101] == ["query.hello", "train"]


def test_the_resend_deadline_follows_how_long_the_phase_takes() -> None:
    """Twice the time by which half of the messages were answered, at least RESEND_FLOOR; with
    fewer answered, the last phase of that type's; with nothing to go by, no resend."""
    messages = [
        Message(RecordDict(), dst_node_id=n, message_type="train", group_id="1")
        for n in (1, 2, 3, 4)
    ]
    sent = Sends(messages, ["a", "b", "c", "d"], at=100.0)
    assert resend_after(sent, None) is None  # nothing known
    sent.answered(1, 103.0)
    earlier = 30.0  # the earlier train phase's typical reply time
    assert resend_after(sent, earlier) == 60.0
    sent.answered(2, 125.0)  # half answered, the second after 25 s
    assert resend_after(sent, earlier) == 50.0
    quick = Sends(messages, ["e", "f", "g", "h"], at=0.0)
    quick.answered(1, 1.0)
    quick.answered(2, 2.0)
    assert resend_after(quick, earlier) == RESEND_FLOOR
    assert sent.due(now=175.0, after=50.0, limit=2) == [3, 4]
    assert sent.due(now=149.0, after=50.0, limit=2) == []
    # a node whose device is ten times slower than the best waits ten times as long
    assert sent.due(now=175.0, after=50.0, limit=2, patience={4: 10.0}) == [3]
    assert sent.due(now=600.0, after=50.0, limit=2, patience={4: 10.0}) == [3, 4]


class FlakyGrid(FakeGrid):
    """A grid whose calls fail now and then, as Flower's SuperLink answers HTTP 500 while its
    SQLite database is locked."""

    def __init__(self, *args: Any, fail: dict[str, list[int]]) -> None:
        super().__init__(*args)
        self.fail = fail  # call name -> the numbers (from 1) of the calls that fail
        self.calls: dict[str, int] = {}

    def _maybe_fail(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.calls[name] in self.fail.get(name, []):
            raise RuntimeError(f"500 Internal Server Error on {name} (database is locked)")

    def get_node_ids(self) -> Any:
        self._maybe_fail("nodes")
        return super().get_node_ids()

    def push_messages(self, messages: Any) -> Any:
        self._maybe_fail("push")
        return super().push_messages(messages)

    def pull_messages(self, message_ids: Any) -> Any:
        self._maybe_fail("pull")
        return super().pull_messages(message_ids)


def test_a_superlink_that_fails_a_call_now_and_then_does_not_stop_the_run(
    run_config: dict[str, Any],
) -> None:
    cfg = settings_of({**run_config, "num-rounds": 2, "final-eval": False, "server-eval": False})

    def run(fail: dict[str, list[int]], tag: str) -> dict[str, Any]:
        out = {**cfg, "out-dir": f"{run_config['out-dir']}-{tag}"}
        engine, _ = _engine(out, FlakyGrid(client_app, 3, out, fail=fail))
        return engine.run()

    limit = exchange.GRID_RETRIES
    flaky = run({"nodes": [1], "push": [2, 3], "pull": list(range(2, 2 + limit))}, "flaky")
    steady = run({}, "steady")
    assert flaky["status"] == "completed"
    assert flaky["last-round"]["train"] == steady["last-round"]["train"]
    events = read_jsonl(Path(f"{run_config['out-dir']}-flaky") / "events.jsonl")
    retries = [e["call"] for e in events if e["event"] == "grid-retry"]
    assert retries.count("pull") == limit and retries.count("push") == 2
    assert retries.count("list nodes") == 1

    with pytest.raises(RuntimeError, match="database is locked"):  # one failure too many
        run({"pull": list(range(1, 2 + limit))}, "broken")
