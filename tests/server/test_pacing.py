"""Deadline rounds and over-selection (docs/pacing.md), in-process on a fake grid: on the
virtual clock the late clients are exactly those whose devices take longer than the deadline,
and the round's aggregate is the one of the on-time replies; over-selection keeps exactly the
count wanted; on the wall clock the deadline holds the phase; the minimum-replies rule still
stops a round; the run's time counts on over a resume."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message

from client.app import app as client_app
from pollen.core.pacing import devices
from pollen.core.registry import get_algorithm
from pollen.core.rundir import read_jsonl
from server.engine import Engine, PhaseFailed
from server.local_grid import task_identity
from server.results import ResultsWriter
from strategies.base import strategy_class
from tests.fakes import FakeClock, FakeGrid, settings_of

TIERS = {"heterogeneity.profile": "tiers", "heterogeneity.clock": "virtual",
         "heterogeneity.slow-fraction": 0.34, "heterogeneity.slowdown": 10.0}  # fmt: skip
Fault = Callable[[int, Message], Any]


def _settings(run_config: dict[str, Any], tag: str, **extra: Any) -> dict[str, Any]:
    return settings_of({
        **run_config, "num-clients": 6, "num-rounds": 2, "resend-limit": 0,
        "phase-timeout": 30.0, "final-eval": False, "out-dir": f"{run_config['out-dir']}-{tag}",
        "run-name": tag, **extra,
    })  # fmt: skip


def _run(cfg: dict[str, Any], fault: Fault | None = None) -> tuple[Engine, dict[str, Any]]:
    grid = FakeGrid(client_app, int(cfg["num-clients"]), cfg)
    if fault is not None:
        grid.faults.append(lambda node, msg, _: fault(node, msg))
    clock = FakeClock()
    strategy = strategy_class(get_algorithm(str(cfg["algorithm"])))(cfg)
    engine = Engine(
        grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep
    )
    with task_identity():
        return engine, engine.run()


def _rows(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")


def _slow(cfg: dict[str, Any]) -> list[int]:
    fleet = devices(cfg, int(cfg["num-clients"]), int(cfg["seed"]))
    fastest = min(d.example_ms for d in fleet)
    return [c for c, d in enumerate(fleet) if d.example_ms > fastest]


def test_a_deadline_round_is_the_round_of_its_on_time_replies(run_config: dict[str, Any]) -> None:
    paced = _settings(run_config, "paced", **TIERS, **{"round.deadline": 2.0})
    slow = _slow(paced)
    assert len(slow) == 2
    engine, summary = _run(paced)
    assert summary["status"] == "completed"
    for row in _rows(paced):
        (train,) = row["phases"]
        assert train["late"] == slow and train["valid"] == 4 and row["late"] == 2
        assert all(train["failed"][str(c)].startswith("late: no valid reply within") for c in slow)
        assert train["closed-at"] == 2.0  # it waited for the slow ones up to the deadline
    # the same run without a deadline, the slow clients' replies lost: the same model
    plain = _settings(run_config, "plain", **TIERS)
    nodes = {engine.roster.clients[c].node_id for c in slow}
    lost, summary = _run(plain, lambda node, msg: "drop" if node in nodes else None)
    assert summary["status"] == "completed"
    mine, theirs = engine.strategy.state()[0], lost.strategy.state()[0]
    assert set(mine) == set(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(mine[key], value, err_msg=key)


def test_a_fast_clients_reply_reports_its_devices_time(run_config: dict[str, Any]) -> None:
    cfg = _settings(run_config, "times", **TIERS)
    engine, _ = _run(cfg)
    fleet = devices(cfg, 6, int(cfg["seed"]))
    (train,) = _rows(cfg)[0]["phases"]
    down, up = train["bytes-sent"] // train["sent"], train["bytes-received"] // train["valid"]
    replies = read_jsonl(Path(cfg["out-dir"]) / "clients.jsonl")
    times = {r["client-id"]: r["metrics"]["device-seconds"] for r in replies if r["round"] == 1}
    for cid, seconds in times.items():
        examples = engine.roster.clients[cid].num_train  # one local epoch
        assert seconds == pytest.approx(fleet[cid].seconds(examples, down, up), rel=1e-6)
    # no deadline: the phase closes with its slowest reply, and the round ends then
    assert train["closed-at"] == pytest.approx(max(times.values()), rel=1e-4)
    assert train["late"] == []


def test_over_selection_keeps_exactly_the_count_wanted(run_config: dict[str, Any]) -> None:
    cfg = _settings(run_config, "over", **TIERS, **{"num-clients": 10, "num-rounds": 3,
                    "fraction-train": 0.5, "round.over-selection": 0.4})  # fmt: skip
    slow = set(_slow(cfg))
    _, summary = _run(cfg)
    assert summary["status"] == "completed"
    for row in _rows(cfg):
        (train,) = row["phases"]
        assert train["sent"] == 7 and train["valid"] == 5 and len(train["late"]) == 2
        kept = {r["client-id"] for r in read_jsonl(Path(cfg["out-dir"]) / "clients.jsonl")
                if r["round"] == row["round"]}  # fmt: skip
        late = set(train["late"])
        assert len(kept) == 5 and not kept & late
        # a slow device arrives after every fast one: the sample's slow clients are late first
        sampled_slow = slow & (kept | late)
        assert late <= sampled_slow if len(sampled_slow) >= 2 else sampled_slow <= late


def test_over_selection_under_client_dp_samples_more_and_keeps_q_n(
    run_config: dict[str, Any],
) -> None:
    from models.privacy import epsilon

    cfg = _settings(run_config, "over-dp", **TIERS, **{
        "num-clients": 10, "num-rounds": 4, "fraction-train": 0.4, "round.over-selection": 0.5,
        "client-dp.noise-multiplier": 2.0, "client-dp.reproducible": True,
    })  # fmt: skip
    _, summary = _run(cfg)
    assert summary["status"] == "completed"
    sent = []
    for row in _rows(cfg):
        (train,) = row["phases"]
        sent.append(train["sent"])
        assert train["valid"] == min(train["sent"], 4)  # the first ceil(q N) arrivals only
        assert len(train["late"]) == max(train["sent"] - 4, 0)
        # every round: the sampled Gaussian at z / 2 (one client in, another out), rate 0.6
        expected = epsilon([(1.0, 0.6, row["round"])], 1e-5)
        assert row["train"]["client-epsilon"] == pytest.approx(expected, rel=1e-9)
    assert max(sent) > 4  # the sample was larger than the count kept


def test_on_the_wall_clock_the_deadline_holds_the_phase(run_config: dict[str, Any]) -> None:
    cfg = _settings(run_config, "wall", **{"round.deadline": 5.0})
    # node 101 answers train only with the next push: after the deadline
    def fault(node: int, msg: Message) -> str | None:
        return "late" if node == 101 and msg.metadata.message_type == "train" else None

    engine, summary = _run(cfg, fault)
    assert summary["status"] == "completed"
    rows = _rows(cfg)
    late = next(c for c, info in engine.roster.clients.items() if info.node_id == 101)
    for row in rows:
        (train,) = row["phases"]
        assert train["late"] == [late] and train["valid"] == 5
    first, second = (row["phases"][0] for row in rows)
    assert 5.0 <= first["closed-at"] < 6.0
    # round 2: node 101's round-1 reply has not come, so it is not sent another instruction
    # (its SuperNode would start a second ClientApp and lose both): late at once, and the
    # phase does not wait for it
    assert "still at work on round 1's train instruction" in second["failed"][str(late)]
    assert second["closed-at"] < 1.0
    grid = engine.grid
    assert isinstance(grid, FakeGrid)
    assert [t for n, t in grid.sent if n == 101].count("train") == 1
    assert rows[-1]["time"] == pytest.approx(sum(r["seconds"] for r in rows), abs=0.01)
    assert 101 not in engine.roster.silent  # late, not lost: asked again once it answered


def test_on_the_wall_clock_a_slow_device_is_not_sent_its_work_again_early(
    run_config: dict[str, Any],
) -> None:
    # neither a fast client's train reply nor the slow ones' come: the fast one is asked
    # again after the resend deadline (10 s), the slow ones (10x) would be after 100 s, past
    # the phase's 30 s: a resend would only have started their work again
    cfg = _settings(run_config, "wall-slow", **{**TIERS, "heterogeneity.clock": "wall",
                    "resend-limit": 2, "min-replies": 1})  # fmt: skip
    slow = set(_slow(cfg))
    grid_nodes: dict[int, int] = {}

    def fault(node: int, msg: Message) -> str | None:
        if msg.metadata.message_type != "train":
            return None
        cid = grid_nodes.get(node)
        return "drop" if cid in slow or cid == fast else None

    fast = min(set(range(6)) - slow)
    grid = FakeGrid(client_app, 6, cfg)
    grid.faults.append(lambda node, msg, _: fault(node, msg))
    clock = FakeClock()
    strategy = strategy_class(get_algorithm("fedavg"))(cfg)
    engine = Engine(
        grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep
    )
    real_discover = engine.discover

    def discover() -> set[int]:
        found = real_discover()
        grid_nodes.update({info.node_id: c for c, info in engine.roster.clients.items()})
        return found

    engine.discover = discover  # type: ignore[method-assign]
    with task_identity():
        summary = engine.run()
    assert summary["status"] == "completed"
    nodes = {c: info.node_id for c, info in engine.roster.clients.items()}
    trains = {c: sum(1 for n, t in grid.sent if n == nodes[c] and t == "train") for c in nodes}
    assert trains[fast] == 2 * 3  # two rounds, each sent and resent twice
    assert all(trains[c] == 2 for c in slow)  # once a round


def test_a_busy_node_that_never_answers_is_asked_again_after_the_phase_timeout(
    run_config: dict[str, Any],
) -> None:
    # node 101 never answers train, and each round's push of train takes 4 s of (fake) time:
    # round 1 closes at the 5 s deadline without it (sent at 0 s); rounds 2 and 3 (at about
    # 5 and 9 s) skip it, still busy; round 4 (13 s, past the 12 s phase-timeout since that
    # send) asks it again, and round 5 skips it again
    cfg = _settings(run_config, "wall-gone", **{"round.deadline": 5.0, "num-rounds": 5,
                    "phase-timeout": 12.0})  # fmt: skip
    clock = FakeClock()

    def fault(node: int, msg: Message, _content: Any) -> str | None:
        if msg.metadata.message_type != "train":
            return None
        if node == 100:
            clock.now += 4.0  # one push of the round's train: 4 s
        return "drop" if node == 101 else None

    grid = FakeGrid(client_app, 6, cfg)
    grid.faults.append(fault)
    strategy = strategy_class(get_algorithm("fedavg"))(cfg)
    engine = Engine(
        grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep
    )
    with task_identity():
        summary = engine.run()
    assert summary["status"] == "completed"
    gone = str(_client_of(engine, 101))
    reasons = [r["phases"][0]["failed"][gone] for r in _rows(cfg)]
    busy = [i + 1 for i, why in enumerate(reasons) if "still at work on round" in why]
    assert busy == [2, 3, 5]
    assert "round 4's train" in reasons[4]
    assert [t for n, t in grid.sent if n == 101].count("train") == 2  # rounds 1 and 4
    assert 101 not in engine.roster.silent


def _client_of(engine: Engine, node: int) -> int:
    return next(c for c, info in engine.roster.clients.items() if info.node_id == node)


def test_over_selection_on_the_wall_clock_closes_at_the_count(run_config: dict[str, Any]) -> None:
    cfg = _settings(run_config, "wall-over", **{"fraction-train": 0.5, "round.over-selection": 1.0})
    _, summary = _run(cfg)
    assert summary["status"] == "completed"
    for row in _rows(cfg):
        (train,) = row["phases"]
        assert train["sent"] == 6 and train["valid"] == 3 and len(train["late"]) == 3


def test_too_few_on_time_replies_stop_the_round(run_config: dict[str, Any]) -> None:
    cfg = _settings(run_config, "few", **TIERS, **{"round.deadline": 2.0, "min-replies": 5})
    with pytest.raises(PhaseFailed):
        _run(cfg)
    summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["last-completed-round"] == 0
    assert "4 valid replies of 6, at least 5 needed" in summary["reason"]
    assert "late: no valid reply within the deadline" in summary["reason"]


def test_a_multi_phase_round_keeps_its_first_phases_cohort(run_config: dict[str, Any]) -> None:
    cfg = _settings(run_config, "fedlrt", **TIERS, **{"algorithm": "fedlrt",
                    **get_algorithm("fedlrt").small, "round.deadline": 4.0})  # fmt: skip
    slow = _slow(cfg)
    _, summary = _run(cfg)
    assert summary["status"] == "completed"
    for row in _rows(cfg):
        first, *later = row["phases"]
        assert first["late"] == slow and first["valid"] == 4
        for phase in later:  # asked only of the first phase's on-time clients
            assert phase["sent"] == 4 and phase["valid"] == 4 and phase["late"] == []


def test_the_runs_time_counts_on_over_a_resume(run_config: dict[str, Any]) -> None:
    cfg = _settings(run_config, "resume", **TIERS, **{"round.deadline": 2.0})
    _run(cfg)
    _, summary = _run({**cfg, "num-rounds": 3, "resume": True})
    assert summary["status"] == "completed"
    times = [row["time"] for row in _rows(cfg)]
    assert times == pytest.approx([2.0, 4.0, 6.0])


def test_without_pacing_the_instructions_and_rows_are_as_before(
    run_config: dict[str, Any],
) -> None:
    cfg = _settings(run_config, "off")
    sent: list[Message] = []
    _run(cfg, lambda _node, msg: sent.append(msg))
    assert sent and all("pollen-device" not in m.content for m in sent)
    for row in _rows(cfg):
        assert "late" not in row and all("late" not in p for p in row["phases"])
