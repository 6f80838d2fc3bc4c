"""Clustered FL on the engine, in-process: per-cluster models reach their clients, clusters
survive checkpoint/resume, a bad reply delays a split instead of breaking the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, RecordDict

from client.app import app as client_app
from federated_data.synthetic_fedem import FedEMSynthetic
from pollen.core import protocol
from pollen.core.rundir import read_jsonl
from server.engine import Engine
from server.results import ResultsWriter
from strategies.base import Federation
from strategies.clustered import Clustered
from tests.fakes import FakeClock, FakeGrid, settings_of

pytestmark = pytest.mark.slow

# with these tolerances every cluster of more than two clients splits whenever all its members
# answered: the rule itself is tested in tests/models/test_clustered.py
ALWAYS_SPLIT = {"clustered.tol1": 1e9, "clustered.tol2": 0.0}


def _config(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return settings_of({
        **run_config, "algorithm": "clustered", "num-clients": 5, "unseen-fraction": 0.2,
        "partitioner": "label-groups", "server-eval": False, **ALWAYS_SPLIT, **extra,
    })  # fmt: skip


def _run(cfg: dict[str, Any], grid: FakeGrid | None = None) -> tuple[Clustered, FakeGrid]:
    grid = grid or FakeGrid(client_app, int(cfg["num-clients"]), cfg)
    strategy = Clustered(cfg)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    return strategy, grid


def _record_payloads(grid: FakeGrid) -> list[tuple[int, str, int, dict[str, np.ndarray]]]:
    """(node, message type, round, arrays) of every instruction carrying arrays."""
    seen: list[tuple[int, str, int, dict[str, np.ndarray]]] = []

    def record(node: int, msg: Message, _: RecordDict | None) -> None:
        content = msg.content
        if protocol.ARRAYS in content:
            kind = msg.metadata.message_type
            seen.append((node, kind, protocol.round_of(content), protocol.arrays_of(content)))

    grid.faults.append(record)
    return seen


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_clusters_split_and_each_client_gets_its_clusters_model(
    run_config: dict[str, Any],
) -> None:
    cfg = _config(run_config)
    grid = FakeGrid(client_app, 5, cfg)
    sent = _record_payloads(grid)
    strategy, _ = _run(cfg, grid)

    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    counts = [r["train"]["clusters"] for r in rows]
    assert counts[0] == 2 and rows[0]["train"]["splits"] == 1
    assert counts == sorted(counts) and counts[-1] == len(strategy.clusters)
    assert sorted(c for members in strategy.clusters for c in members) == [0, 1, 2, 3]
    assert all(r["train"]["max-update-norm"] > 0 for r in rows)

    # round 2: clients of one round-1 cluster got one model, of different clusters different ones
    received = {
        node - 100: arrays for node, kind, rnd, arrays in sent if kind == "train" and rnd == 2
    }
    groups: list[list[int]] = []
    for cid in sorted(received):
        home = next((g for g in groups if _same(received[g[0]], received[cid])), None)
        home.append(cid) if home is not None else groups.append([cid])
    assert len(groups) == counts[0]
    assert all(any(set(m) <= set(g) for g in groups) for m in strategy.clusters)

    # final evaluation: a training client gets its cluster's model, the unseen one all of them
    final = {node - 100: arrays for node, kind, _, arrays in sent if kind == "evaluate"}
    for cid in range(4):
        assert _same(final[cid], strategy.models[strategy.cluster_of(cid)])
    assert {k.partition(".")[0] for k in final[4]} == {f"comp{k}" for k in range(int(counts[-1]))}
    summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())["final"]["eval"]
    assert summary["clients"] == 4.0 and summary["unseen-clients"] == 1.0
    assert summary["clusters"] == counts[-1]
    assert 0.0 <= summary["unseen-test-accuracy"] <= 1.0 and "unseen-train-loss" in summary


def test_default_tolerances_keep_one_cluster_on_a_short_run(run_config: dict[str, Any]) -> None:
    cfg = _config(run_config, **{"clustered.tol1": 0.4, "clustered.tol2": 1.6, "num-rounds": 2,
                                 "final-eval": False})  # fmt: skip
    strategy, _ = _run(cfg)
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    # digits from scratch: the shared model is far from stationary, so the mean update is large
    assert all(r["train"]["mean-update-norm"] > 0.4 for r in rows)
    assert [r["train"]["clusters"] for r in rows] == [1, 1] and len(strategy.clusters) == 1


def test_clusters_and_models_survive_checkpoint_and_resume(run_config: dict[str, Any]) -> None:
    whole = _config(run_config, **{"out-dir": run_config["out-dir"] + "-a", "run-name": "a"})
    a, _ = _run(whole)
    part = {**whole, "out-dir": run_config["out-dir"] + "-b", "run-name": "b", "num-rounds": 2}
    _run(settings_of(part))
    b, _ = _run(settings_of({**part, "num-rounds": 3, "resume": True}))
    assert b.clusters == a.clusters and len(a.clusters) > 1
    for ma, mb in zip(a.models, b.models, strict=True):
        for key, value in ma.items():
            np.testing.assert_allclose(mb[key], value, rtol=1e-5, atol=1e-6)
    ra = read_jsonl(Path(whole["out-dir"]) / "metrics.jsonl")
    rb = read_jsonl(Path(part["out-dir"]) / "metrics.jsonl")
    assert [r["round"] for r in rb] == [1, 2, 3]
    for x, y in zip(ra, rb, strict=True):
        assert y["train"] == pytest.approx(x["train"], rel=1e-5)


def test_malformed_reply_is_skipped_and_delays_the_split(run_config: dict[str, Any]) -> None:
    cfg = _config(run_config, **{"num-rounds": 2, "final-eval": False})
    grid = FakeGrid(client_app, 5, cfg)

    def truncate(content: RecordDict) -> RecordDict:
        values = protocol.arrays_of(content)
        first = next(iter(values))
        values[first] = values[first][:-1]
        out = RecordDict({k: v for k, v in content.items() if k != protocol.ARRAYS})
        out[protocol.ARRAYS] = protocol.to_record(values)
        return out

    def fault(node: int, msg: Message, _: RecordDict | None) -> Any:
        first_train = msg.metadata.message_type == "train" and protocol.round_of(msg.content) == 1
        return truncate if node == 100 and first_train else None

    grid.faults.append(fault)
    strategy, _ = _run(cfg, grid)
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert "invalid reply" in rows[0]["phases"][-1]["failed"]["0"]
    assert rows[0]["train"]["clients"] == 3.0
    # client 0 could not be placed in round 1, so its cluster waited; round 2 split it
    assert [r["train"]["clusters"] for r in rows] == [1, 2]
    assert sorted(c for members in strategy.clusters for c in members) == [0, 1, 2, 3]


class Recording(Clustered):
    """Clustered FL keeping its clusters after every round."""

    def initialize(self, seed: int) -> None:
        super().initialize(seed)
        self.history: list[list[list[int]]] = []

    def run_round(self, fed: Federation) -> dict[str, float]:
        metrics = super().run_round(fed)
        self.history.append(sorted(sorted(members) for members in self.clusters))
        return metrics


def test_clusters_recover_the_true_groups_of_a_clustered_federation(
    run_config: dict[str, Any],
) -> None:
    """Sattler et al. (2020), as the baseline of Marfoq et al. (2021, Sec. 2.3: Clustered FL is
    the mixture with one-hot weights): clients whose data follow one of three linear rules
    (FedEM's synthetic generator, Dirichlet concentration 0.01, so each client draws (almost)
    only from one rule) are split by the cosine similarity of their updates along the true
    groups: every cluster ever formed holds one group, or several whole groups, and the
    federation reaches exactly the three true groups."""
    clients, groups, dim = 12, 3, 20
    cfg = settings_of({
        **run_config, "algorithm": "clustered", "num-clients": clients, "num-rounds": 10,
        "dataset": "fedem-synthetic", "partitioner": "natural", "model": "linear",
        "synthetic.mode": "clean", "synthetic.alpha": 0.01, "synthetic.components": groups,
        "synthetic.dimension": dim, "synthetic.train-size": 100, "synthetic.test-size": 100,
        "synthetic.seed": 3, "val-fraction": 0.0, "lr": 0.1, "momentum": 0.9,
        "persist-momentum": True, "batch-size": 32, "server-eval": False,
        "clustered.tol1": 0.4, "clustered.tol2": 0.5,
    })  # fmt: skip
    strategy = Recording(cfg)
    clock = FakeClock()
    grid = FakeGrid(client_app, clients, cfg)
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    truth = FedEMSynthetic(clients, dim, groups, 0.01, seed=3, mode="clean", train_size=100)
    group = truth.true_pi.argmax(1)
    assert truth.true_pi.max(1).min() > 0.9  # every client follows mostly one rule
    members = [set(np.flatnonzero(group == g).tolist()) for g in range(groups)]

    def separated(cluster: list[int]) -> bool:
        """One group's clients only, or whole groups."""
        present = {int(group[c]) for c in cluster}
        return len(present) == 1 or all(members[g] <= set(cluster) for g in present)

    print("clusters after each round:", *strategy.history, sep="\n  ")
    assert all(separated(cluster) for found in strategy.history for cluster in found)
    assert sorted(sorted(m) for m in members) in strategy.history
