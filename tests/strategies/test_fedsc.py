"""FedSC on the engine, in-process (digits, tiny settings): two phases, per-client Rbar_{-j},
stale copies, privacy ledger and budget, malformed correlation replies, FedAvg + SC and
FedAvg + SimCLR baselines."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, RecordDict

from client.app import app as client_app
from client.state import StateStore
from federated_data import load_client_data
from models.dp_correlation import release_epsilon
from pollen.core import protocol
from pollen.core.contracts.fedsc import FedSCSettings
from pollen.core.dataspec import data_spec
from pollen.core.registry import get_algorithm
from pollen.core.rundir import read_jsonl
from pollen.core.settings import Scalar
from server.engine import Engine
from server.results import ResultsWriter
from strategies.base import strategy_class
from strategies.fedsc import FedAvgSC, FedSC, shares
from strategies.schedule import learning_rate
from tests.fakes import FakeClock, FakeGrid, settings_of

DIM = 8


def _cfg(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return settings_of({
        **run_config, "algorithm": "fedsc", "num-clients": 4, "num-rounds": 2,
        "partitioner": "one-class", "classes-per-client": 2, "lr": 0.05, "batch-size": 64,
        "fedsc.dim": DIM, "fedsc.passes": 1, "fedsc.views-per-pass": 1, "fedsc.knn-k": 20,
        "fedsc.probe-epochs": 3, **extra,
    })  # fmt: skip


def _run(cfg: dict[str, Any], strategy: FedSC, nodes: int = 4) -> FakeGrid:
    grid = FakeGrid(client_app, nodes, cfg)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    return grid


def _capture(grid: FakeGrid) -> list[tuple[int, Message]]:
    """Records every instruction the grid delivers."""
    seen: list[tuple[int, Message]] = []

    def fault(node: int, msg: Message, _reply: RecordDict | None) -> None:
        seen.append((node, msg))

    grid.faults.append(fault)
    return seen


def test_cosine_learning_rate() -> None:
    """The reference schedule: lr (1 + cos(pi (t-1)/T))/2, from lr down towards 0."""
    settings: dict[str, Scalar] = {"lr": 0.03, "lr-schedule": "cosine", "num-rounds": 200}
    assert learning_rate(settings, 1) == pytest.approx(0.03)
    assert learning_rate(settings, 101) == pytest.approx(0.015)
    assert learning_rate(settings, 200) == pytest.approx(0.015 * (1 + np.cos(np.pi * 199 / 200)))


def test_share_schedules() -> None:
    every = FedSCSettings(share="every-round", share_after=0)
    assert all(shares(every, t) for t in (1, 2, 3))
    after = FedSCSettings(share="after", share_after=2)
    assert [shares(after, t) for t in (1, 2, 3, 4)] == [False, False, True, True]
    even = FedSCSettings(share="after-even", share_after=2)
    assert [shares(even, t) for t in (3, 4, 5, 6)] == [False, True, False, True]
    assert not shares(FedSCSettings(share="never", share_after=0), 1)


@pytest.mark.slow
def test_fedsc_run_shares_per_client_others_and_keeps_a_ledger(
    run_config: dict[str, Any],
) -> None:
    cfg = _cfg(run_config, **{"fraction-train": 0.5, "min-train-clients": 2,
                              "fedsc.noise-std": 1e-3, "fedsc.delta": 1e-3})  # fmt: skip
    strategy = FedSC(cfg)
    grid = FakeGrid(client_app, 4, cfg)
    seen = _capture(grid)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()

    corr = [(n, m) for n, m in seen if m.metadata.message_type == "query.correlation"]
    round_of = [protocol.round_of(m.content) for _, m in corr]
    assert round_of.count(1) == 4 and round_of.count(2) == 2  # first sharing round: everyone
    trains = [m for _, m in seen if m.metadata.message_type == "train"]
    assert all("others" not in m.content for m in trains if protocol.round_of(m.content) == 1)
    second = [m for m in trains if protocol.round_of(m.content) == 2]
    assert len(second) == 2
    rbars = [protocol.arrays_of(m.content, "others")["r"] for m in second]
    assert rbars[0].shape == (DIM, DIM) and not np.allclose(rbars[0], rbars[1])
    assert protocol.config_of(second[0].content)["alpha"] == pytest.approx(0.6)

    assert sorted(strategy.latest) == [0, 1, 2, 3]  # two of them stale after round 2
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert rows[1]["train"]["epsilon"] > rows[0]["train"]["epsilon"] > 0
    assert [r["train"]["releases-max"] for r in rows] == [1.0, 2.0]
    assert 0.0 <= rows[-1]["train"]["knn-accuracy"] <= 1.0
    assert "global-knn-accuracy" in rows[-1]["server-eval"]
    final = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())["final"]["eval"]
    assert 0.0 <= final["probe-accuracy"] <= 1.0 and "knn-accuracy" in final
    for cid in range(4):
        ledger = StateStore(Path(cfg["out-dir"]) / "client-state" / "test" / f"client-{cid}")
        saved = ledger.load(10)
        assert saved is not None and saved[1]["releases"] == strategy.releases[cid]
        assert saved[1]["epsilon"] == pytest.approx(strategy.epsilon(cid))

    arrays, meta = strategy.state()
    restored = FedSC(cfg)
    restored.load_state(arrays, json.loads(json.dumps(meta)))
    assert restored.releases == strategy.releases and sorted(restored.latest) == [0, 1, 2, 3]
    assert set(restored.weights) == set(strategy.weights)


def _corrupt(make: Callable[[np.ndarray], np.ndarray]) -> Callable[[RecordDict], RecordDict]:
    def edit(content: RecordDict) -> RecordDict:
        r = protocol.arrays_of(content, "correlation")["r"]
        content["correlation"] = protocol.to_record({"r": make(r)})
        return content

    return edit


@pytest.mark.slow
def test_malformed_correlations_are_rejected_and_the_run_continues(
    run_config: dict[str, Any],
) -> None:
    cfg = _cfg(run_config, **{"num-rounds": 2})
    strategy = FedSC(cfg)
    grid = FakeGrid(client_app, 4, cfg)
    bad = {
        100: _corrupt(lambda r: r[:-1]),  # wrong shape
        101: _corrupt(lambda r: r + np.triu(np.ones_like(r), 1)),  # asymmetric
        102: _corrupt(lambda r: np.full_like(r, np.nan)),  # NaN
    }

    def fault(node: int, msg: Message, _reply: RecordDict | None) -> Any:
        return bad.get(node) if msg.metadata.message_type == "query.correlation" else None

    grid.faults.append(fault)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    assert sorted(strategy.latest) == [3]
    events = read_jsonl(Path(cfg["out-dir"]) / "events.jsonl")
    ends = [
        e for e in events if e.get("event") == "phase-end" and e["phase"] == "query.correlation"
    ]
    reasons = " ".join(json.dumps(e) for e in ends)
    assert "shape" in reasons and "symmetric" in reasons and "NaN" in reasons
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert len(rows) == 2 and rows[-1]["train"]["clients"] == 4.0


@pytest.mark.slow
def test_budget_stops_sharing_and_fedavg_sc_shares_nothing(run_config: dict[str, Any]) -> None:
    cfg = _cfg(run_config, **{"num-rounds": 3, "fedsc.noise-std": 0.05, "fedsc.delta": 1e-3,
                              "server-eval": False, "final-eval": False})  # fmt: skip
    spec, cache = data_spec(cfg), Path(cfg["cache-dir"])
    sizes = [len(load_client_data(spec, c, cache).train) for c in range(4)]
    f = FedSCSettings.of(cfg)

    def epsilon(releases: int, n: int) -> float:
        return release_epsilon(
            releases, n, mu=f.mu, noise_std=f.noise_std, delta=f.delta, convention=f.sensitivity
        )

    eps1 = [epsilon(1, n) for n in sizes]
    eps2 = [epsilon(2, n) for n in sizes]
    assert max(eps1) < min(eps2)
    budget = (max(eps1) * min(eps2)) ** 0.5  # room for one release per client, not two
    budget_cfg = settings_of({**cfg, "fedsc.epsilon-budget": budget})
    strategy = FedSC(budget_cfg)
    _run(budget_cfg, strategy)
    assert strategy.releases == {0: 1, 1: 1, 2: 1, 3: 1}
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert [r["train"]["shared"] for r in rows if "shared" in r["train"]] == [4.0, 0.0, 0.0]
    assert max(r["train"]["epsilon"] for r in rows) == pytest.approx(max(eps1))
    assert len(rows) == 3

    base = settings_of({**cfg, "algorithm": "fedavg-sc", "out-dir": cfg["out-dir"] + "-sc",
                        "run-name": "sc"})  # fmt: skip
    grid = FakeGrid(client_app, 4, base)
    seen = _capture(grid)
    clock = FakeClock()
    avg = FedAvgSC(base)
    Engine(grid, base, avg, ResultsWriter(base["out-dir"]), clock=clock, sleep=clock.sleep).run()
    assert not any(m.metadata.message_type == "query.correlation" for _, m in seen)
    assert all("others" not in m.content for _, m in seen)
    assert avg.releases == {} and not avg.latest


@pytest.mark.slow
def test_fedsc_without_sharing_is_fedavg_sc(run_config: dict[str, Any]) -> None:
    """With sharing disabled FedSC trains exactly what FedAvg + SC trains (alpha 0.2 from
    round 1, so any Rbar sent would show)."""
    weights = []
    for algorithm in ("fedsc", "fedavg-sc"):
        cfg = _cfg(run_config, **{"algorithm": algorithm, "num-rounds": 1, "fedsc.share": "never",
                                  "fedsc.alpha-schedule": "constant",
                                  "server-eval": False, "final-eval": False,
                                  "out-dir": f"{run_config['out-dir']}-{algorithm}",
                                  "run-name": algorithm})  # fmt: skip
        strategy = FedSC(cfg) if algorithm == "fedsc" else FedAvgSC(cfg)
        _run(cfg, strategy)
        weights.append(strategy.weights)
    for key, value in weights[0].items():
        np.testing.assert_array_equal(weights[1][key], value)


@pytest.mark.slow
def test_others_is_the_weighted_mean_of_the_other_clients_latest_matrices(
    run_config: dict[str, Any],
) -> None:
    """Wiring of Alg. 1 under partial participation: round t's matrices are computed at the
    model the round trains from (theta^{t-1}), and the Rbar_{-j} a client trains with is
    sum_{k != j} n_k R~_k / sum_{k != j} n_k over the latest copies (fresh for this round's
    clients, stale for the others), never including its own."""
    cfg = _cfg(run_config, **{"fraction-train": 0.5, "min-train-clients": 2, "num-rounds": 3,
                              "server-eval": False, "final-eval": False})  # fmt: skip
    strategy = FedSC(cfg)
    grid = FakeGrid(client_app, 4, cfg)
    released: dict[tuple[int, int], np.ndarray] = {}
    trains: dict[tuple[int, int], Message] = {}
    queries: dict[tuple[int, int], Message] = {}

    def record(node: int, msg: Message, _reply: RecordDict | None) -> Any:
        key = (protocol.round_of(msg.content), node - 100)
        if msg.metadata.message_type == "train":
            trains[key] = msg
        if msg.metadata.message_type != "query.correlation":
            return None
        queries[key] = msg

        def keep(content: RecordDict) -> RecordDict:
            released[key] = protocol.arrays_of(content, "correlation")["r"].astype(np.float64)
            return content

        return keep

    grid.faults.append(record)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()

    sizes = strategy.sizes
    checked = 0
    for t in (2, 3):
        latest = {
            cid: released[max(r for r, c in released if c == cid and r <= t), cid] for cid in sizes
        }
        for (rnd, cid), msg in trains.items():
            if rnd != t:
                continue
            rest = [k for k in sizes if k != cid]
            expected = sum(sizes[k] * latest[k] for k in rest) / sum(sizes[k] for k in rest)
            sent = protocol.arrays_of(msg.content, "others")["r"]
            np.testing.assert_allclose(sent, expected, rtol=1e-5, atol=1e-7)
            model = protocol.arrays_of(msg.content)
            for query_cid in [c for r, c in queries if r == t]:
                asked = protocol.arrays_of(queries[t, query_cid].content)
                for name, value in model.items():
                    np.testing.assert_array_equal(asked[name], value)
            checked += 1
    assert checked == 4  # two clients in each of rounds 2 and 3


def _run_baseline(
    run_config: dict[str, Any], algorithm: str
) -> tuple[dict[str, Any], FedAvgSC, dict[str, np.ndarray], list[tuple[int, Message]]]:
    """An engine run of a FedAvg-server baseline on 4 fake clients: (settings, strategy after
    the run, initial weights, instructions delivered)."""
    cfg = _cfg(run_config, **{"algorithm": algorithm, "server-eval": False})
    strategy = strategy_class(get_algorithm(algorithm))(cfg)
    assert isinstance(strategy, FedAvgSC)
    grid = FakeGrid(client_app, 4, cfg)
    seen = _capture(grid)
    strategy.initialize(int(cfg["seed"]))
    initial = {k: v.copy() for k, v in strategy.weights.items()}
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    return cfg, strategy, initial, seen


@pytest.mark.slow
def test_fedavg_simclr_trains_nt_xent_and_shares_nothing(run_config: dict[str, Any]) -> None:
    cfg, strategy, initial, seen = _run_baseline(run_config, "fedavg-simclr")
    types = {m.metadata.message_type for _, m in seen}
    assert types == {"query.hello", "train", "evaluate"}
    assert all("others" not in m.content for _, m in seen)
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    losses = [r["train"]["train-loss"] for r in rows]
    # NT-Xent: a cross-entropy over 2b - 1 candidates with logits in [-1/t, 1/t] (the spectral
    # loss of fedavg-sc is negative)
    bound = np.log(2 * 64 - 1) + 2 / float(cfg["simclr.temperature"])
    assert all(0.0 < v < bound for v in losses), losses
    assert "alpha" not in rows[-1]["train"]
    assert any(not np.allclose(initial[k], v) for k, v in strategy.weights.items())
    final = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())["final"]["eval"]
    assert 0.0 <= final["probe-accuracy"] <= 1.0 and 0.0 <= final["global-knn-accuracy"] <= 1.0


@pytest.mark.slow
def test_fedavg_byol_trains_online_and_predictor_and_shares_nothing(
    run_config: dict[str, Any],
) -> None:
    cfg, strategy, initial, seen = _run_baseline(run_config, "fedavg-byol")
    assert any(k.startswith("predictor.") for k in initial)  # the predictor is averaged too
    assert {m.metadata.message_type for _, m in seen} == {"query.hello", "train", "evaluate"}
    assert all("others" not in m.content for _, m in seen)
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    losses = [r["train"]["train-loss"] for r in rows]
    assert all(0.0 < v < 8.0 for v in losses), losses  # two terms of 2 - 2 cos, each in [0, 4]
    for part in ("backbone.", "projector.", "predictor."):
        assert any(
            not np.allclose(initial[k], v)
            for k, v in strategy.weights.items()
            if k.startswith(part)
        ), part
    final = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())["final"]["eval"]
    assert 0.0 <= final["probe-accuracy"] <= 1.0 and 0.0 <= final["global-knn-accuracy"] <= 1.0
