"""Simulated nodes hosting several clients (setting simulation-nodes), in-process: a run packed
onto few nodes ends bitwise where the same run with one node per client ends, for every
algorithm; a client that raises, answers badly or not at all inside a packed message is the
only one skipped, with its reason; sampling sends only the sampled clients' instructions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from client.app import app as client_app
from pollen.core import protocol
from pollen.core.registry import get_algorithm
from pollen.core.rundir import read_jsonl
from server.engine import Engine
from server.results import ResultsWriter
from strategies.base import strategy_class
from tests.fakes import FakeClock, FakeGrid, settings_of
from tests.server.test_bad_replies import ROUNDS

CLIENTS = 5
NODES = 2  # node 0 hosts clients 0 and 1; node 1 hosts 2, 3 and 4

# every algorithm the packing must leave unchanged; the slowest are marked slow
SLOW = {"fedsc", "fedavg-simclr", "fedavg-byol", "adept-dgm"}
ALGORITHMS = [
    pytest.param(a, marks=pytest.mark.slow) if a in SLOW else a for a in sorted(ROUNDS)
]


def _settings(run_config: dict[str, Any], algorithm: str, tag: str, **extra: Any) -> Any:
    cfg, _ = ROUNDS[algorithm]
    return settings_of({
        **run_config, "algorithm": algorithm, "num-clients": CLIENTS, "num-rounds": 2,
        "out-dir": f"{run_config['out-dir']}-{tag}", "run-name": tag,
        "min-available-clients": CLIENTS, **cfg, **extra,
    })  # fmt: skip


def _run(
    cfg: dict[str, Any], nodes: int, fault: Callable[[int, Message, Any], Any] | None = None
) -> tuple[Engine, FakeGrid, dict[str, Any]]:
    grid = FakeGrid(client_app, nodes, cfg)
    if fault is not None:
        grid.faults.append(fault)
    clock = FakeClock()
    strategy = strategy_class(get_algorithm(str(cfg["algorithm"])))(cfg)
    engine = Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock, clock.sleep)
    return engine, grid, engine.run()


def _results(cfg: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """metrics.jsonl and clients.jsonl without what depends on time or message counts."""
    out = Path(cfg["out-dir"])

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: strip(v)
                for k, v in value.items()
                if not (k.startswith("time-") or "seconds" in k or k in ("peak-rss-mb", "phases"))
            }
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(read_jsonl(out / "metrics.jsonl")), strip(read_jsonl(out / "clients.jsonl"))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_packed_run_ends_bitwise_where_one_node_per_client_ends(
    run_config: dict[str, Any], algorithm: str
) -> None:
    one = _settings(run_config, algorithm, "one")
    packed = _settings(run_config, algorithm, "packed", **{"simulation-nodes": NODES})
    ref, ref_grid, ref_summary = _run(one, CLIENTS)
    engine, grid, summary = _run(packed, NODES)
    assert summary["status"] == ref_summary["status"] == "completed"
    assert summary["clients"] == ref_summary["clients"] == list(range(CLIENTS))
    # one message per node and phase instead of one per client
    assert len(grid.sent) < len(ref_grid.sent)
    assert {node for node, _ in grid.sent} == {100, 101}
    arrays, meta = engine.strategy.state()
    ref_arrays, ref_meta = ref.strategy.state()
    assert meta == ref_meta and set(arrays) == set(ref_arrays)
    for key, value in ref_arrays.items():
        np.testing.assert_array_equal(arrays[key], value, err_msg=key)
    assert _results(packed) == _results(one)
    assert summary["final"]["eval"] == ref_summary["final"]["eval"]


@pytest.mark.parametrize("algorithm", ["fedavg", "fedem", "local"])
def test_a_packed_dp_sgd_run_ends_bitwise_where_one_node_per_client_ends(
    run_config: dict[str, Any], algorithm: str
) -> None:
    """DP-SGD with reproducible randomness (`dp.reproducible`: batches and noise from the run's
    seed, per client) packed and unpacked: the same models, the same ledgers."""
    dp = {"dp.noise-multiplier": 1.0, "dp.reproducible": True}
    one = _settings(run_config, algorithm, "dp-one", **dp)
    packed = _settings(run_config, algorithm, "dp-packed", **{"simulation-nodes": NODES, **dp})
    ref, _, ref_summary = _run(one, CLIENTS)
    engine, _, summary = _run(packed, NODES)
    assert summary["status"] == ref_summary["status"] == "completed"
    arrays, meta = engine.strategy.state()
    ref_arrays, ref_meta = ref.strategy.state()
    assert meta == ref_meta and meta["dp-ledgers"] and set(arrays) == set(ref_arrays)
    for key, value in ref_arrays.items():
        np.testing.assert_array_equal(arrays[key], value, err_msg=key)
    rounds, clients = _results(packed)
    assert (rounds, clients) == _results(one)
    assert rounds[-1]["train"]["epsilon"] > rounds[0]["train"]["epsilon"] > 0
    assert {c["client-id"] for c in clients if "epsilon" in c["metrics"]} == set(range(CLIENTS))


def _packed_train(msg: Message) -> bool:
    return protocol.is_packed(msg.content) and msg.metadata.message_type == "train"


def test_a_client_that_raises_inside_a_packed_message_is_the_only_one_skipped(
    run_config: dict[str, Any],
) -> None:
    cfg = _settings(run_config, "fedem", "raises", **{"simulation-nodes": NODES})

    def fault(node: int, msg: Message, _: Any) -> None:
        if _packed_train(msg) and msg.metadata.group_id == "2" and "2/arrays" in msg.content:
            del msg.content["2/arrays"]  # client 2's handler finds no model and raises
        return None

    _, _, summary = _run(cfg, NODES, fault)
    assert summary["status"] == "completed"
    rounds = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    (train,) = rounds[1]["phases"]
    assert train["sent"] == CLIENTS and train["valid"] == CLIENTS - 1
    assert list(train["failed"]) == ["2"]
    assert train["failed"]["2"].startswith("error: KeyError")
    # its node's other clients (3 and 4) answered in that round, and client 2 in the next
    answered = read_jsonl(Path(cfg["out-dir"]) / "clients.jsonl")
    assert {r["client-id"] for r in answered if r["round"] == 2} == {0, 1, 3, 4}
    assert {r["client-id"] for r in answered if r["round"] == 3} == set(range(CLIENTS))


def _corrupt_part(cid: int, how: str) -> Callable[[RecordDict], RecordDict]:
    def change(content: RecordDict) -> RecordDict:
        if how == "bad-count":
            metrics = content[f"{cid}/{protocol.METRICS}"]
            assert isinstance(metrics, MetricRecord)
            metrics[protocol.NUM_EXAMPLES] = -1
        elif how in ("missing", "empty"):
            for name in [n for n in content if n.startswith(f"{cid}/")]:
                del content[name]
            if how == "missing":  # not even listed
                listed = content[protocol.PACK]
                assert isinstance(listed, ConfigRecord)
                clients = listed["clients"]
                assert isinstance(clients, list)
                listed["clients"] = [int(c) for c in clients if c != cid]
        elif how == "other-client":
            envelope = content[f"{cid}/{protocol.ENVELOPE}"]
            assert isinstance(envelope, ConfigRecord)
            envelope["client-id"] = (cid + 1) % CLIENTS
        elif how == "stray-record":
            content["9/metrics"] = MetricRecord({"x": 1.0})
        return content

    return change


@pytest.mark.parametrize(
    ("how", "failed"),
    [
        ("bad-count", {"3": "num-examples -1"}),
        ("missing", {"3": "no reply in its node's packed reply"}),
        ("empty", {"3": "no 'pollen' envelope"}),
        ("other-client", {"3": "reply from client 4, expected 3"}),
        # a record of a client the pack does not list: the whole reply is malformed
        ("stray-record", {k: "invalid packed reply" for k in ("2", "3", "4")}),
    ],
)
def test_a_bad_part_of_a_packed_reply_skips_only_its_client(
    run_config: dict[str, Any], how: str, failed: dict[str, str]
) -> None:
    cfg = _settings(run_config, "fedavg", how, **{"simulation-nodes": NODES})

    def fault(node: int, msg: Message, _: Any) -> Any:
        if _packed_train(msg) and msg.metadata.group_id == "1" and node == 101:
            return _corrupt_part(3, how)
        return None

    _, _, summary = _run(cfg, NODES, fault)
    assert summary["status"] == "completed"
    (train,) = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]["phases"]
    assert sorted(train["failed"]) == sorted(failed)
    for cid, reason in failed.items():
        assert reason in train["failed"][cid]
    assert train["valid"] == CLIENTS - len(failed)


def test_an_error_reply_of_a_packed_node_skips_its_clients_until_it_is_greeted_again(
    run_config: dict[str, Any],
) -> None:
    cfg = _settings(run_config, "fedavg", "error", **{"simulation-nodes": NODES})

    def fault(node: int, msg: Message, _: Any) -> Any:
        first_train = _packed_train(msg) and msg.metadata.group_id == "1"
        return "error" if first_train and node == 100 else None

    _, _, summary = _run(cfg, NODES, fault)
    assert summary["status"] == "completed"
    rounds = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    (train,) = rounds[0]["phases"]
    assert sorted(train["failed"]) == ["0", "1"]
    assert all("error reply" in r for r in train["failed"].values())
    # round 2 greets node 100 again and its two clients train
    hello, train2 = rounds[1]["phases"]
    assert hello["phase"] == "query.hello" and hello["valid"] == 2
    assert train2["valid"] == CLIENTS


def test_sampling_sends_only_the_sampled_clients_and_leaves_the_others_state_alone(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    n = 40
    cfg = settings_of({
        **_settings(run_config, "fedem", "sampled", **{"simulation-nodes": 4}),
        "num-clients": n, "min-available-clients": n, "fraction-train": 0.1, "num-rounds": 1,
        "final-eval": False, "partitioner": "iid", "client-state-dir": str(tmp_path / "state"),
    })  # fmt: skip
    sizes: list[int] = []

    def fault(node: int, msg: Message, _: Any) -> None:
        if msg.metadata.message_type == "train":
            sizes.append(len(protocol.unpack(msg.content)))

    _, _, summary = _run(cfg, 4, fault)
    assert summary["status"] == "completed"
    trained = {
        r["client-id"]
        for r in read_jsonl(Path(cfg["out-dir"]) / "clients.jsonl")
        if r["phase"] == "train"
    }
    assert len(trained) == 4 and sum(sizes) == 4  # a tenth of the clients, in the messages
    assert len(sizes) <= 4  # at most one message per node
    kept = {int(p.name.split("-")[1]) for p in (tmp_path / "state" / "sampled").iterdir()}
    assert kept == trained  # FedEM's personal state: only the clients that trained have one


def _pull_one_at_a_time(grid: FakeGrid, order: Callable[[Message], int]) -> None:
    """The grid hands out one reply a pull: the first in `order` of those it holds."""
    pull = grid.pull_messages
    held: list[Message] = []

    def one_at_a_time(ids: Any) -> list[Message]:
        nonlocal held
        got = sorted([*held, *pull(ids)], key=order)
        held = got[1:]
        return got[:1]

    grid.pull_messages = one_at_a_time  # type: ignore[method-assign,assignment]


def _first_training(grid: FakeGrid, cfg: Any) -> tuple[Engine, Any, dict[int, RecordDict]]:
    """An engine and FedAvg strategy on `grid`, its clients greeted, and round 1's training
    instructions for the 5 clients."""
    clock = FakeClock()
    strategy = strategy_class(get_algorithm("fedavg"))(cfg)
    engine = Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock, clock.sleep)
    engine.server_round = 1
    engine.wait_for_clients()
    strategy.initialize(1)
    model = protocol.to_record(strategy.weights)  # type: ignore[attr-defined]
    payloads = {c: protocol.instruction(1, "train", {"lr": 0.1}, arrays=model) for c in range(5)}
    return engine, strategy, payloads


def test_fold_takes_replies_in_client_order_whatever_order_nodes_answer_in(
    run_config: dict[str, Any],
) -> None:
    """Node 101 (clients 2-4) answers before node 100 (clients 0-1), one message per poll, and
    client 3's part is bad: the fold still sees 0, 1, 2, 4 in that order, each with its arrays;
    the replies returned keep only their metrics and envelope."""
    cfg = _settings(run_config, "fedavg", "fold", **{"simulation-nodes": NODES})
    grid = FakeGrid(client_app, NODES, cfg)
    grid.faults.append(
        lambda node, msg, _: _corrupt_part(3, "bad-count")
        if _packed_train(msg) and node == 101
        else None
    )
    _pull_one_at_a_time(grid, lambda m: -m.metadata.src_node_id)
    engine, strategy, payloads = _first_training(grid, cfg)
    seen: list[tuple[int, bool]] = []
    arrived: list[int] = []
    grid_pull = grid.pull_messages

    def tracking(ids: Any) -> list[Message]:
        got = list(grid_pull(ids))
        arrived.extend(m.metadata.src_node_id for m in got)
        return got

    grid.pull_messages = tracking  # type: ignore[method-assign,assignment]
    replies = engine.exchange(
        "train", payloads, strategy.validate,  # type: ignore[attr-defined]
        fold=lambda cid, r: seen.append((cid, protocol.ARRAYS in r)),
    )  # fmt: skip
    assert arrived == [101, 100]  # the later clients' node first
    assert seen == [(0, True), (1, True), (2, True), (4, True)]
    assert sorted(replies) == [0, 1, 2, 4]
    assert all(protocol.ARRAYS not in r and protocol.METRICS in r for r in replies.values())


def test_a_run_resumed_with_another_packing_ends_where_an_uninterrupted_one_does(
    run_config: dict[str, Any],
) -> None:
    """FedEM, round 1 on two nodes, resumed for round 2 on five (one client each): bitwise the
    run that went through on one node per client (simulation-nodes may change on resume)."""
    whole = _settings(run_config, "fedem", "whole", **{"final-eval": False})
    ref, _, _ = _run(whole, CLIENTS)
    part = _settings(run_config, "fedem", "part", **{"final-eval": False, "num-rounds": 1,
                                                     "simulation-nodes": NODES})  # fmt: skip
    _run(part, NODES)
    resumed_cfg = settings_of({**part, "num-rounds": 2, "resume": True, "simulation-nodes": 5})
    resumed, _, summary = _run(resumed_cfg, CLIENTS)
    assert summary["status"] == "completed"
    arrays, _ = resumed.strategy.state()
    ref_arrays, _ = ref.strategy.state()
    for key, value in ref_arrays.items():
        np.testing.assert_array_equal(arrays[key], value, err_msg=key)


def test_a_reply_whose_turn_has_come_is_folded_right_after_its_screening(
    run_config: dict[str, Any],
) -> None:
    """Nodes answering in client order: each client's reply is folded as soon as it passes the
    checks, before the next client's part of the same packed reply is checked (its arrays are
    then still in the CPU's cache); the fold's order and results are those of the folds after
    the whole message."""
    cfg = _settings(run_config, "fedavg", "fold-at-once", **{"simulation-nodes": NODES})
    grid = FakeGrid(client_app, NODES, cfg)
    _pull_one_at_a_time(grid, lambda m: m.metadata.src_node_id)  # node 100 (clients 0-1) first
    engine, strategy, payloads = _first_training(grid, cfg)
    events: list[tuple[str, int]] = []
    validate = strategy.validate  # type: ignore[attr-defined]

    def screened(cid: int, content: RecordDict) -> None:
        events.append(("screen", cid))
        validate(cid, content)

    engine.exchange("train", payloads, screened, fold=lambda cid, r: events.append(("fold", cid)))
    assert events == [(step, c) for c in range(5) for step in ("screen", "fold")]


def test_every_packed_node_is_greeted_in_one_hello(run_config: dict[str, Any]) -> None:
    """A packed hello names several clients a node: the hello waits for every node, not for
    as many replies as it greeted nodes (a paced phase's rule, docs/pacing.md). Node 101's
    first hello is answered late (with the next push, a resend)."""
    cfg = _settings(run_config, "fedavg", "greeted", **{"simulation-nodes": NODES})
    first: list[Message] = []

    def late(node: int, msg: Message, _: Any) -> str | None:
        hello = msg.metadata.message_type == protocol.HELLO
        if node == 101 and hello and not first:
            first.append(msg)
            return "late"
        return None

    _, _, summary = _run(cfg, NODES, late)
    assert summary["status"] == "completed"
    hellos = [e for e in read_jsonl(Path(cfg["out-dir"]) / "events.jsonl")
              if e["event"] == "phase-end" and e["phase"] == protocol.HELLO]  # fmt: skip
    assert len(hellos) == 1 and hellos[0]["valid"] == CLIENTS and hellos[0]["failed"] == {}
