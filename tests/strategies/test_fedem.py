"""FedEM on the engine, in-process: aggregation rules, M = 1 is FedAvg, personal state,
unseen clients."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.app import app as client_app
from client.state import StateStore
from pollen.core.rundir import read_jsonl
from server.engine import Engine
from server.results import ResultsWriter
from strategies.base import Strategy
from strategies.dfedem import DFedEM
from strategies.fedavg import FedAvg
from strategies.fedem import FedEM, stale_average
from tests.fakes import FakeClock, FakeGrid, settings_of


def _run(cfg: dict[str, Any], strategy: Strategy, nodes: int = 3) -> FakeGrid:
    grid = FakeGrid(client_app, nodes, cfg)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    return grid


def test_stale_average_damps_by_the_sampled_share() -> None:
    old = {"w": np.zeros(2, np.float32)}
    models = [{"w": np.ones(2, np.float32)}, {"w": 3 * np.ones(2, np.float32)}]
    full = stale_average(old, models, [10, 30], total=40)
    np.testing.assert_allclose(full["w"], [2.5, 2.5])
    half = stale_average(old, models, [10, 30], total=80)
    np.testing.assert_allclose(half["w"], [1.25, 1.25])
    assert half["w"].dtype == np.float32
    with pytest.raises(ValueError, match="do not fit"):
        stale_average(old, models, [10, 30], total=20)


def test_one_component_is_exactly_fedavg(run_config: dict[str, Any]) -> None:
    base = {
        **run_config,
        "num-rounds": 2,
        "final-eval": False,
        "server-eval": False,
        "momentum": 0.5,
    }
    avg_cfg = settings_of({**base, "out-dir": run_config["out-dir"] + "-avg"})
    em_cfg = settings_of(
        {
            **base,
            "algorithm": "fedem",
            "fedem.components": 1,
            "out-dir": run_config["out-dir"] + "-em",
            "persist-momentum": False,
        }
    )
    fedavg, fedem = FedAvg(avg_cfg), FedEM(em_cfg)
    _run(avg_cfg, fedavg)
    _run(em_cfg, fedem)
    for key, value in fedavg.weights.items():
        np.testing.assert_allclose(fedem.weights[f"comp0.{key}"], value, rtol=1e-6, atol=1e-7)


def test_fedem_learns_keeps_pi_on_disk_and_serves_unseen_clients(
    run_config: dict[str, Any],
) -> None:
    cfg = settings_of({
        **run_config, "algorithm": "fedem", "num-clients": 4, "num-rounds": 4,
        "partitioner": "label-groups", "dirichlet-alpha": 0.4, "fedem.components": 2,
        "unseen-fraction": 0.25, "momentum": 0.9, "lr": 0.05, "persist-momentum": True,
    })  # fmt: skip
    strategy = FedEM(cfg)
    grid = _run(cfg, strategy, nodes=4)
    # components start different
    comps = strategy.components()
    assert not all(np.allclose(comps[0][k], comps[1][k]) for k in comps[0])
    # client 3 is unseen: greeted and evaluated, never trained
    assert (103, "train") not in grid.sent and (103, "evaluate") in grid.sent
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert rows[-1]["train"]["clients"] == 3.0
    assert rows[-1]["train"]["test-accuracy"] > rows[0]["train"]["test-accuracy"] + 0.3
    summary_eval = __import__("json").loads((Path(cfg["out-dir"]) / "summary.json").read_text())[
        "final"
    ]["eval"]
    assert summary_eval["clients"] == 3.0 and summary_eval["unseen-clients"] == 1.0
    assert 1 <= summary_eval["unseen-em-iterations"] <= 100
    assert summary_eval["unseen-test-accuracy"] > 0.5
    # each training client's pi (and momentum) persisted, on the simplex
    for cid in range(3):
        arrays, meta = StateStore(
            Path(cfg["out-dir"]) / "client-state" / "test" / f"client-{cid}"
        ).load(10)  # type: ignore[misc]
        assert meta["round"] == 4
        assert arrays["pi"].shape == (2,) and abs(arrays["pi"].sum() - 1) < 1e-9
        assert any(k.startswith("momentum1.") for k in arrays)


def test_renormalize_and_stale_agree_under_full_participation(run_config: dict[str, Any]) -> None:
    results = []
    for rule in ("stale", "renormalize"):
        cfg = settings_of(
            {
                **run_config,
                "algorithm": "fedem",
                "num-rounds": 1,
                "fedem.aggregation": rule,
                "final-eval": False,
                "out-dir": f"{run_config['out-dir']}-{rule}",
                "run-name": rule,
            }
        )
        strategy = FedEM(cfg)
        _run(cfg, strategy)
        results.append(strategy.weights)
    for key, value in results[0].items():
        np.testing.assert_allclose(results[1][key], value, rtol=1e-5, atol=1e-6)


def test_mixing_matrix_is_symmetric_doubly_stochastic_on_a_connected_graph() -> None:
    from strategies.gossip import erdos_renyi, is_connected, metropolis_hastings

    adjacency = erdos_renyi(30, 0.5, np.random.default_rng(0))
    assert is_connected(adjacency) and not adjacency.diagonal().any()
    w = metropolis_hastings(adjacency)
    np.testing.assert_allclose(w, w.T)
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    assert (w >= 0).all() and ((w > 0) == (adjacency | np.eye(30, dtype=bool))).all()
    assert not is_connected(np.zeros((3, 3), dtype=bool))


def test_d_fedem_gossips_without_a_global_model(run_config: dict[str, Any]) -> None:
    from strategies.dfedem import DFedEM

    cfg = settings_of({
        **run_config, "algorithm": "d-fedem", "num-clients": 4, "num-rounds": 4,
        "partitioner": "label-groups", "fedem.components": 2, "lr": 0.05,
        "d-fedem.edge-probability": 0.7,
    })  # fmt: skip
    strategy = DFedEM(cfg)
    _run(cfg, strategy, nodes=4)
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    # the clients' models differ after local steps, and gossip keeps them close
    assert all(r["train"]["consensus-distance"] > 0 for r in rows)
    assert rows[-1]["train"]["test-accuracy"] > rows[0]["train"]["test-accuracy"] + 0.3
    assert strategy.global_arrays() is None
    # one client's start is the weighted sum over its neighbourhood only
    t = 0
    start = strategy.gossip(t)
    key = next(iter(start))
    expected = sum(
        strategy.mixing[s, t] * strategy.models[s][key].astype(np.float64) for s in range(4)
    )
    np.testing.assert_allclose(start[key], expected, rtol=1e-6)


def test_fedavg_serves_unseen_clients_the_global_model(run_config: dict[str, Any]) -> None:
    cfg = settings_of(
        {**run_config, "num-clients": 4, "unseen-fraction": 0.25, "algorithm": "fedavg-plus"}
    )
    grid = _run(cfg, FedAvg(cfg), nodes=4)
    assert (103, "train") not in grid.sent and (103, "evaluate") in grid.sent
    final = __import__("json").loads((Path(cfg["out-dir"]) / "summary.json").read_text())["final"][
        "eval"
    ]
    assert final["clients"] == 3.0 and final["unseen-clients"] == 1.0
    assert "unseen-global-test-accuracy" in final and "unseen-test-accuracy" in final
    assert "unseen-train-accuracy" in final


def test_d_fedem_rounds_without_local_steps_are_gossip_averaging_to_consensus(
    run_config: dict[str, Any],
) -> None:
    """Marfoq et al. (2021), Alg. 4 and Assumption 9: a D-FedEM round sets each client's
    components to Σ_s w_st θ_s over its neighbourhood, with a symmetric doubly stochastic mixing
    matrix W. With no local progress (learning rate 0) the rounds through the strategy and the
    real client are repeated averaging Ξ ← ΞW: the mean over clients never moves, the consensus
    distance Σ_t ‖θ_t − θ̄‖² shrinks every round by at least λ₂(W)² (λ₂ the second largest
    eigenvalue modulus, Assumption 9 with τ = 1) and the clients reach the mean."""
    clients, rounds = 6, 12

    class Spread(DFedEM):
        """Clients start from different components (seeded per client)."""

        def initialize(self, seed: int) -> None:
            super().initialize(seed)
            rng = np.random.default_rng(seed)
            self.models = [
                {k: (v + rng.normal(size=v.shape)).astype(v.dtype) for k, v in m.items()}
                for m in self.models
            ]
            self.start = [dict(m) for m in self.models]

    cfg = settings_of({
        **run_config, "algorithm": "d-fedem", "num-clients": clients, "num-rounds": rounds,
        "dataset": "fedem-synthetic", "partitioner": "natural", "model": "linear",
        "synthetic.dimension": 10, "synthetic.components": 2, "synthetic.train-size": 20,
        "synthetic.test-size": 20, "val-fraction": 0.0, "fedem.components": 2, "lr": 0.0,
        "server-eval": False, "final-eval": False, "d-fedem.edge-probability": 0.7,
    })  # fmt: skip
    strategy = Spread(cfg)
    _run(cfg, strategy, nodes=clients)

    def flat(models: list[dict[str, np.ndarray]]) -> np.ndarray:
        keys = sorted(models[0])
        return np.stack([np.concatenate([m[k].ravel() for k in keys]) for m in models])

    start, end = flat(strategy.start).astype(np.float64), flat(strategy.models)
    mixing = strategy.mixing
    np.testing.assert_allclose(mixing, mixing.T, atol=0)
    np.testing.assert_allclose(mixing.sum(0), 1.0, atol=1e-12)
    second = np.sort(np.abs(np.linalg.eigvalsh(mixing)))[-2]
    assert 0 < second < 1
    mean = start.mean(0)
    np.testing.assert_allclose(end.mean(0), mean, atol=1e-5)
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    distances = [float(((start - mean) ** 2).sum(1).mean())]
    distances += [r["train"]["consensus-distance"] for r in rows]
    for before, after in itertools.pairwise(distances):
        assert after <= second**2 * before * (1 + 1e-4) + 1e-10
    print(f"λ₂ = {second:.3f}; consensus distance {distances[0]:.2e} -> {distances[-1]:.2e}")
    assert distances[-1] < 1e-4 * distances[0]
    np.testing.assert_allclose(end, np.broadcast_to(mean, end.shape), atol=0.05)
def test_one_step_unseen_clients_take_one_em_step_at_each_evaluation(
    run_config: dict[str, Any],
) -> None:
    """fedem.unseen-protocol=one-step, unseen-every=2, 3 rounds: the unseen client is evaluated
    before rounds 1 and 3 and at the end (never trained), one EM iteration each time, each
    from the pi it stored the time before, with the components of that moment."""
    from flwr.app import Message, RecordDict

    from client.common import split_tensors
    from client.env import ClientEnv
    from client.fedem import _losses, packed_models
    from models.mixture import fit_mixture_weights
    from pollen.core import protocol

    cfg = settings_of({
        **run_config, "algorithm": "fedem", "num-clients": 4, "num-rounds": 3,
        "fedem.components": 2, "unseen-fraction": 0.25, "lr": 0.05,
        "fedem.unseen-protocol": "one-step", "fedem.unseen-every": 2,
    })  # fmt: skip
    grid = FakeGrid(client_app, 4, cfg)
    sent: list[tuple[int, RecordDict]] = []  # (round, components) of every evaluation of 103

    def record(node: int, msg: Message, _reply: RecordDict | None) -> None:
        if node == 103 and msg.metadata.message_type == "evaluate":
            sent.append((protocol.round_of(msg.content), msg.content))

    grid.faults.append(record)
    clock = FakeClock()
    strategy = FedEM(cfg)
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    assert (103, "train") not in grid.sent
    assert [rnd for rnd, _ in sent] == [1, 3, 4]  # before rounds 1 and 3, and the final one
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert [r["train"].get("unseen-em-iterations") for r in rows] == [1.0, None, 1.0]
    assert rows[0]["train"]["unseen-clients"] == 1.0 and "unseen-test-accuracy" in rows[2]["train"]
    summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    assert summary["final"]["eval"]["unseen-em-iterations"] == 1.0

    # the stored pi is the chain of single warm-started steps with each evaluation's components
    env = ClientEnv(3, cfg, Path(cfg["out-dir"]) / "client-state", "test",
                    Path(str(cfg["cache-dir"])), None)  # fmt: skip
    data = split_tensors(env, "train")
    pi = None
    for _, content in sent:
        pi, _ = fit_mixture_weights(_losses(packed_models(content, 2, env), data), 1, pi=pi)
    saved = env.state.load(before_round=10)
    assert saved is not None and saved[1]["round"] == 4
    assert pi is not None
    np.testing.assert_allclose(saved[0]["pi"], pi.numpy(), rtol=1e-12)
    # which differs from one step from uniform weights with the final components
    fresh, _ = fit_mixture_weights(_losses(packed_models(sent[-1][1], 2, env), data), 1)
    assert np.abs(saved[0]["pi"] - fresh.numpy()).sum() > 1e-6


def test_converge_unseen_clients_are_evaluated_only_at_the_end(run_config: dict[str, Any]) -> None:
    cfg = settings_of({
        **run_config, "algorithm": "fedem", "num-clients": 4, "num-rounds": 2,
        "fedem.components": 2, "unseen-fraction": 0.25,
    })  # fmt: skip
    grid = _run(cfg, FedEM(cfg), nodes=4)
    assert [t for n, t in grid.sent if n == 103 and t != "query.hello"] == ["evaluate"]
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert not any(k.startswith("unseen-") for r in rows for k in r["train"])
