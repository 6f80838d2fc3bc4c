"""FeDLRT's least-squares oracles (models.least_squares) through the FeDLRT strategy and the
engine (messages, float32 wire, reply checks): the iterates of the same algorithm run
in-process by the plain functions of models.least_squares, the descent inequality of the
paper's Theorem 2 round by round, the drift ordering of the three variance corrections and the
rank dead zone of the truncation.

The network clients of client/fedlrt.py train classifiers, so the client half here is a small
ClientApp answering the same three phases for a least-squares client with the same NumPy
operations (models.fedlrt); the strategy, engine and message path are the real ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

import strategies.fedlrt
from models.fedlrt import (
    Factors,
    Truncation,
    corrected_descent,
    factorize,
    max_rank,
    padded_coefficients,
)
from models.least_squares import (
    LeastSquaresClient,
    client_weights,
    global_loss,
    heterogeneous_problem,
    homogeneous_problem,
    initial_factors,
    run_fedlrt,
)
from pollen.core import protocol
from pollen.core.rundir import read_jsonl
from server.engine import Engine
from server.results import ResultsWriter
from strategies.fedlrt import FeDLRT
from tests.fakes import FakeClock, FakeGrid, settings_of

N, RANK0, STEPS, LR, TAU, ROUNDS, SEED = 10, 5, 100, 1e-3, 0.01, 30, 0
CLIENTS, TARGET = heterogeneous_problem(n=N, rank=2, points_per_client=2500, seed=SEED)
START = initial_factors(N, RANK0, SEED)
LAYER = "w"


def _f64(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float64) for k, v in arrays.items()}


def least_squares_app(clients: Sequence[LeastSquaresClient], steps: int) -> ClientApp:
    """Client half of FeDLRT for the least-squares clients (partition-id = client index), each
    taking `steps` local steps; the round's U, s, V, Ū, V̄ are kept in memory between phases."""
    app = ClientApp()
    kept: dict[int, dict[str, Any]] = {}

    def client(context: Context) -> tuple[int, LeastSquaresClient]:
        cid = int(context.node_config["partition-id"])  # type: ignore[call-overload]
        return cid, clients[cid]

    def answer(msg: Message, cid: int, metrics: dict[str, float], **arrays: Any) -> Message:
        n = len(clients[cid])
        content = protocol.reply(msg.content, cid, {protocol.NUM_EXAMPLES: n, **metrics}, **arrays)
        return Message(content, reply_to=msg)

    def f32(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.asarray(v, np.float32) for k, v in arrays.items()}

    @app.query("hello")
    def hello(msg: Message, context: Context) -> Message:
        return answer(msg, client(context)[0], {"val-examples": 0, "test-examples": 0})

    @app.query("fedlrt_basis")
    def basis(msg: Message, context: Context) -> Message:
        cid, data = client(context)
        got = _f64(protocol.arrays_of(msg.content))
        F = Factors(got[f"{LAYER}.U"], got[f"{LAYER}.s"], got[f"{LAYER}.V"])
        g_u, g_v, g_s = data.factor_grads(F)
        kept[cid] = {"F": F}
        grads = {f"{LAYER}.U": g_u, f"{LAYER}.V": g_v}
        if protocol.config_of(msg.content)["var-cor"] == "simplified":
            grads[f"{LAYER}.S"] = g_s
        return answer(msg, cid, {}, grads=f32(grads))

    def augmented(cid: int, content: RecordDict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if "bases" in content:
            kept[cid]["bars"] = _f64(protocol.arrays_of(content, "bases"))
        F, bars = kept[cid]["F"], kept[cid]["bars"]
        U = np.hstack([F.U, bars[f"{LAYER}.Ubar"]])
        V = np.hstack([F.V, bars[f"{LAYER}.Vbar"]])
        return U, V, padded_coefficients(F.s, U.shape[1] - F.rank)

    @app.query("fedlrt_coef_grad")
    def coef_grad(msg: Message, context: Context) -> Message:
        cid, data = client(context)
        U, V, S0 = augmented(cid, msg.content)
        grad = data.coefficient_grad(U, V)(S0)
        return answer(msg, cid, {}, grads=f32({f"{LAYER}.S": grad}))

    @app.train("fedlrt_coef")
    def train(msg: Message, context: Context) -> Message:
        cid, data = client(context)
        U, V, S0 = augmented(cid, msg.content)
        term = np.zeros_like(S0)
        if "corrections" in msg.content:
            v = _f64(protocol.arrays_of(msg.content, "corrections"))[f"{LAYER}.S"]
            term[: v.shape[0], : v.shape[1]] = v
        lr = float(protocol.config_of(msg.content)["lr"])
        S = corrected_descent(S0, data.coefficient_grad(U, V), lr, steps, term)
        return answer(msg, cid, {}, arrays=f32({f"{LAYER}.S": S}))

    return app


class LeastSquaresFeDLRT(FeDLRT):
    """FeDLRT whose one factorized layer is the least-squares matrix W (no dense parameters),
    starting from `start`."""

    start = START

    def layer_names(self) -> list[str]:
        return [LAYER]

    def initialize(self, seed: int) -> None:
        self.factors, self.dense = {LAYER: self.start}, {}

    def server_evaluate(self) -> dict[str, float]:
        return {}


def _run(
    run_config: dict[str, Any],
    clients: Sequence[LeastSquaresClient],
    start: Factors,
    var_cor: str,
    *,
    lr: float,
    steps: int,
    rounds: int,
    tau: float,
    tag: str,
    **extra: Any,
) -> tuple[LeastSquaresFeDLRT, list[dict[str, Any]]]:
    """A FeDLRT run over the engine; the strategy and the rows of metrics.jsonl."""
    cfg = settings_of({**run_config, "algorithm": "fedlrt", "num-clients": len(clients),
                       "num-rounds": rounds, "lr": lr, "final-eval": False, "server-eval": False,
                       "fedlrt.var-cor": var_cor, "fedlrt.tau": tau,
                       "fedlrt.dense-correction": False, "run-name": tag,
                       "out-dir": f"{run_config['out-dir']}-{tag}", **extra})  # fmt: skip
    strategy = LeastSquaresFeDLRT(cfg)
    strategy.start = start
    clock = FakeClock()
    grid = FakeGrid(least_squares_app(clients, steps), len(clients), cfg)
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock,
           sleep=clock.sleep).run()  # fmt: skip
    return strategy, read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("var_cor", ["simplified", "full"])
def test_h2_through_the_strategy_matches_the_plain_functions(
    run_config: dict[str, Any], var_cor: str
) -> None:
    strategy, rows = _run(run_config, CLIENTS, START, var_cor, lr=LR, steps=STEPS,
                          rounds=ROUNDS, tau=TAU, tag=var_cor)  # fmt: skip

    # the same algorithm in float64, no messages; the strategy caps ranks at ⌊n/2⌋
    ref = run_fedlrt(CLIENTS, START, var_cor, LR, STEPS, ROUNDS, TAU, r_max=max_rank(N, N))
    assert [int(r["train"][f"rank-{LAYER}"]) for r in rows] == ref.rank
    W = strategy.factors[LAYER].dense()
    # float32 messages (relative rounding 6e-8 per value) against float64 throughout, over a
    # run that moved W by O(1)
    moved = np.abs(ref.W - START.dense()).max()
    print(f"{var_cor}: max |W - W_ref| = {np.abs(W - ref.W).max():.1e}, moved {moved:.1e}")
    assert np.abs(W - ref.W).max() < 1e-6 * moved


def _smoothness(clients: Sequence[LeastSquaresClient]) -> float:
    """L: the largest eigenvalue of the global loss's Hessian Σ_c p_c K_cᵀK_c / N_c (rows of
    K_c: kron(a_i, b_i)); the loss is quadratic, so this is its exact smoothness constant."""
    n = clients[0].A.shape[1]
    hessian = np.zeros((n * n, n * n))
    for w, c in zip(client_weights(clients), clients, strict=True):
        K = np.einsum("ij,ik->ijk", c.A, c.B).reshape(len(c), n * n)
        hessian += w * (K.T @ K) / len(c)
    return float(np.linalg.eigvalsh(hessian)[-1])


def _recording(calls: list[tuple[np.ndarray, np.ndarray, np.ndarray, Truncation]]) -> Callable:
    """`truncate` as the strategy calls it, recording its inputs Ũ, S̃*, Ṽ and its result."""
    real = strategies.fedlrt.truncate

    def truncate(U: np.ndarray, S: np.ndarray, V: np.ndarray, *args: Any) -> Truncation:
        out = real(U, S, V, *args)
        calls.append((U.copy(), S.copy(), V.copy(), out))
        return out

    return truncate


def _descent_slack(
    run_config: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    start: Factors,
    var_cor: str,
    rounds: int,
    tag: str,
) -> tuple[list[float], list[float]]:
    """A run on H2 with λ = 1/(24 L s*), s* = 20, and per round the slack of Theorem 8's
    inequality (before truncation) and of Theorem 2's (after it): right side minus left side,
    negative where the inequality fails. Ũ, S̃*, Ṽ are the strategy's own, read where it
    truncates; the rank cap is full rank, so that truncation alone decides (below ϑ)."""
    steps = 20
    L = _smoothness(CLIENTS)
    lr = 1.0 / (24 * L * steps)
    rate = steps * lr * (1 - 12 * steps * lr * L)
    calls: list[tuple[np.ndarray, np.ndarray, np.ndarray, Truncation]] = []
    monkeypatch.setattr(strategies.fedlrt, "truncate", _recording(calls))
    _run(run_config, CLIENTS, start, var_cor, lr=lr, steps=steps, rounds=rounds, tau=TAU,
         tag=tag, **{"fedlrt.max-rank": N})  # fmt: skip
    assert len(calls) == rounds
    weights = client_weights(CLIENTS)
    W = start.dense()
    before_cut, after_cut = [], []
    for U, S, V, cut in calls:
        G = sum(w * c.grad(W) for w, c in zip(weights, CLIENTS, strict=True))
        decrease = rate * float(np.linalg.norm(U.T @ G @ V) ** 2)  # ‖∇_S̃ L(Ũ S̃ Ṽᵀ)‖² = ‖ŨᵀGṼ‖²
        merged, kept = U @ S @ V.T, cut.factors.dense()
        assert np.linalg.norm(merged - kept) == pytest.approx(cut.discarded, abs=1e-12)
        assert cut.discarded < cut.threshold
        loss = global_loss(CLIENTS, W)
        before_cut.append(loss - decrease - global_loss(CLIENTS, merged))
        after_cut.append(loss - decrease + L * cut.threshold - global_loss(CLIENTS, kept))
        W = kept
    return before_cut, after_cut


def test_the_descent_inequality_of_theorem_2_holds_round_by_round(
    run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schotthöfer & Laiu (2024), Theorem 2 (and Theorem 8, its step before truncation): with
    full variance correction and 0 < λ ≤ 1/(12 L s*), every round satisfies
        L(Ũ S̃* Ṽᵀ) − L(Wᵗ) ≤ −s*λ(1 − 12 s*λL) ‖∇_S̃ L(Ũ S̃ Ṽᵀ)‖²,
        L(Wᵗ⁺¹) − L(Wᵗ) ≤ −s*λ(1 − 12 s*λL) ‖∇_S̃ L(Ũ S̃ Ṽᵀ)‖² + Lϑ,
    with ‖Ũ S̃* Ṽᵀ − Wᵗ⁺¹‖ < ϑ, on the heterogeneous problem H2 (client drift), λ = 1/(24 L s*):
    from the usual start, and from the minimiser itself, where the gradient vanishes and the
    corrected local steps must not move. Without correction the clients drift away from the
    minimiser and the first inequality fails in every round."""
    tol = 1e-12  # float32 on the wire moves the loss at the minimiser by ~4e-15
    before, after = _descent_slack(run_config, monkeypatch, START, "full", 12, "far")
    print(f"from the start: least slack {min(before):.1e} (before truncation), {min(after):.1e}")
    assert min(before) > -tol and min(after) > -tol
    optimum = factorize(TARGET, 2)
    before, after = _descent_slack(run_config, monkeypatch, optimum, "full", 4, "optimum")
    print(f"from the minimiser: least slack {min(before):.1e}, {min(after):.1e}")
    assert min(before) > -tol and min(after) > -tol
    before, _ = _descent_slack(run_config, monkeypatch, optimum, "none", 4, "optimum-none")
    print(f"from the minimiser, no correction: greatest slack {max(before):.1e}")
    assert max(before) < -1e3 * tol


def test_drift_ordering_full_simplified_none_and_the_true_rank(run_config: dict[str, Any]) -> None:
    """Schotthöfer & Laiu (2024), Sec. 3.1 and Theorem 1: the variance correction bounds the
    coefficient drift of heterogeneous clients. On H2 (4 clients, non-iid features and
    targets, rank-2 global minimiser) after 20 rounds the gap to the minimum orders as full <
    simplified < none; full correction converges and truncation finds the true rank 2 (Sec.
    4.1, Figure 1), the others plateau at a higher rank."""
    rounds, steps, lr = 20, 20, 2.5e-2
    best = global_loss(CLIENTS, TARGET)
    gaps, ranks = {}, {}
    for var_cor in ("none", "simplified", "full"):
        strategy, rows = _run(run_config, CLIENTS, START, var_cor, lr=lr, steps=steps,
                              rounds=rounds, tau=TAU, tag=f"drift-{var_cor}")  # fmt: skip
        gaps[var_cor] = global_loss(CLIENTS, strategy.factors[LAYER].dense()) - best
        ranks[var_cor] = [int(r["train"][f"rank-{LAYER}"]) for r in rows]
    print({k: f"{v:.1e}" for k, v in gaps.items()}, {k: v[-1] for k, v in ranks.items()})
    assert gaps["full"] < 1e-5 < 1e-2 < gaps["simplified"] < 0.5 * gaps["none"]
    assert ranks["full"][-5:] == [2] * 5
    assert min(ranks["none"][-1], ranks["simplified"][-1]) > 2


def test_the_rank_dead_zone_of_relative_truncation(
    run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schotthöfer & Laiu (2024), Sec. 3.1 (truncation: keep the smallest r₁ with
    ‖[σ_{r₁+1}, …, σ_{2r}]‖ < ϑ, ϑ = τ‖S̃*‖): the r new directions of a round enter S̃* with
    coefficients of order λs*‖∇L‖, so with relative τ they are cut whenever that is below
    τ‖S̃*‖. On the homogeneous problem H1 (rank-2 target) started at rank 1 with the paper's
    λ = 1e-3, s* = 20: with τ = 0.1 every round's S̃* has its new directions below ϑ, the rank
    stays 1 and the loss stalls; τ = 1e-3 lets the rank grow in the first round. Exactly at
    the threshold: with τ just above round 1's ‖σ₂‖/‖σ‖ the rank stays 1, just below it is 2."""
    clients, _ = homogeneous_problem(n=8, rank=2, points=2000, clients=4, seed=0)
    start = initial_factors(8, 1, 0)
    rounds, steps, lr = 12, 20, 1e-3

    def run(tau: float, tag: str, rounds: int = rounds) -> tuple[float, list[int]]:
        strategy, rows = _run(run_config, clients, start, "simplified", lr=lr, steps=steps,
                              rounds=rounds, tau=tau, tag=tag)  # fmt: skip
        ranks = [int(r["train"][f"rank-{LAYER}"]) for r in rows]
        return global_loss(clients, strategy.factors[LAYER].dense()), ranks

    calls: list[tuple[np.ndarray, np.ndarray, np.ndarray, Truncation]] = []
    monkeypatch.setattr(strategies.fedlrt, "truncate", _recording(calls))
    stuck, ranks = run(0.1, "dead")
    assert ranks == [1] * rounds
    tails = []
    for _, S, _, _ in calls:
        sigma = np.linalg.svd(S, compute_uv=False)
        assert len(sigma) == 2 and sigma[1] > 0  # the new direction was trained, then cut
        tails.append(sigma[1] / np.linalg.norm(sigma))
    print(f"new direction / ‖S̃*‖ per round: {np.round(tails, 4)}")
    assert max(tails) < 0.1
    grown, ranks = run(1e-3, "alive")
    assert ranks[0] == 2
    assert grown < 0.9 * stuck
    # round 1 does not depend on τ until its truncation
    for tau, rank in ((1.01 * tails[0], 1), (0.99 * tails[0], 2)):
        _, ranks = run(tau, f"edge-{rank}", rounds=1)
        assert ranks == [rank]
