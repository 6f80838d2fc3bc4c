"""The least-squares problem H2 (models.least_squares) through the FeDLRT strategy and the
engine (messages, float32 wire, reply checks) gives the iterates of the same algorithm run
in-process by the plain functions of models.least_squares.

The network clients of client/fedlrt.py train classifiers, so the client half here is a small
ClientApp answering the same three phases for a least-squares client with the same NumPy
operations (models.fedlrt); the strategy, engine and message path are the real ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from models.fedlrt import Factors, corrected_descent, max_rank, padded_coefficients
from models.least_squares import (
    LeastSquaresClient,
    heterogeneous_problem,
    initial_factors,
    run_fedlrt,
)
from pollen import protocol
from server.engine import Engine
from server.results import ResultsWriter, read_jsonl
from strategies.fedlrt import FeDLRT
from tests.fakes import FakeClock, FakeGrid, settings_of

N, RANK0, STEPS, LR, TAU, ROUNDS, SEED = 10, 5, 100, 1e-3, 0.01, 30, 0
CLIENTS, _ = heterogeneous_problem(n=N, rank=2, points_per_client=2500, seed=SEED)
START = initial_factors(N, RANK0, SEED)
LAYER = "w"


def _f64(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float64) for k, v in arrays.items()}


def least_squares_app() -> ClientApp:
    """Client half of FeDLRT for the least-squares clients (partition-id = client index);
    the round's U, s, V, Ū, V̄ are kept in memory between phases."""
    app = ClientApp()
    kept: dict[int, dict[str, Any]] = {}

    def client(context: Context) -> tuple[int, LeastSquaresClient]:
        cid = int(context.node_config["partition-id"])  # type: ignore[call-overload]
        return cid, CLIENTS[cid]

    def answer(msg: Message, cid: int, metrics: dict[str, float], **arrays: Any) -> Message:
        n = len(CLIENTS[cid])
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
        S = corrected_descent(S0, data.coefficient_grad(U, V), lr, STEPS, term)
        return answer(msg, cid, {}, arrays=f32({f"{LAYER}.S": S}))

    return app


class LeastSquaresFeDLRT(FeDLRT):
    """FeDLRT whose one factorized layer is the least-squares matrix W (no dense parameters)."""

    def layer_names(self) -> list[str]:
        return [LAYER]

    def initialize(self, seed: int) -> None:
        self.factors, self.dense = {LAYER: START}, {}

    def server_evaluate(self) -> dict[str, float]:
        return {}


@pytest.mark.slow
@pytest.mark.parametrize("var_cor", ["simplified", "full"])
def test_h2_through_the_strategy_matches_the_plain_functions(
    run_config: dict[str, Any], var_cor: str
) -> None:
    cfg = settings_of({**run_config, "algorithm": "fedlrt", "num-clients": len(CLIENTS),
                       "num-rounds": ROUNDS, "lr": LR, "final-eval": False, "server-eval": False,
                       "fedlrt.var-cor": var_cor, "fedlrt.tau": TAU,
                       "fedlrt.dense-correction": False,
                       "out-dir": f"{run_config['out-dir']}-{var_cor}"})  # fmt: skip
    strategy = LeastSquaresFeDLRT(cfg)
    clock = FakeClock()
    grid = FakeGrid(least_squares_app(), len(CLIENTS), cfg)
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock,
           sleep=clock.sleep).run()  # fmt: skip
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")

    # the same algorithm in float64, no messages; the strategy caps ranks at ⌊n/2⌋
    ref = run_fedlrt(CLIENTS, START, var_cor, LR, STEPS, ROUNDS, TAU, r_max=max_rank(N, N))
    assert [int(r["train"][f"rank-{LAYER}"]) for r in rows] == ref.rank
    W = strategy.factors[LAYER].dense()
    # float32 messages (relative rounding 6e-8 per value) against float64 throughout, over a
    # run that moved W by O(1)
    moved = np.abs(ref.W - START.dense()).max()
    print(f"{var_cor}: max |W - W_ref| = {np.abs(W - ref.W).max():.1e}, moved {moved:.1e}")
    assert np.abs(W - ref.W).max() < 1e-6 * moved
