"""Byzantine-robust FedSC (issue #34; strategies/fedsc.py's module docstring): the plain mean is
bitwise the old round; a robust rule keeps the model and each client's Rbar_{-j} near the
honest clients', Rbar_{-j} symmetric positive semidefinite and inside the box the server
accepts from clients; a short run on digits with two sign-flipping clients of ten learns as
the clean run does."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from client.app import app as client_app
from models.spectral import others, psd_projection, within_bound
from pollen.core import protocol
from pollen.core.contracts.fedsc import CORRELATION, OTHERS
from server.app import app as server_app
from server.engine import PhaseFailed
from strategies.aggregate import weighted_average
from strategies.base import ClientInfo
from strategies.fedsc import FedSC
from strategies.robust import Combiner
from tests.fakes import FakeGrid, ScriptedFederation, settings_of

N, BAD, DIM = 10, (8, 9), 8

CLIENTS = [ClientInfo(c, 100 + c, 100 + 10 * c, 0, 10) for c in range(N)]


def _cfg(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return settings_of({
        **run_config, "algorithm": "fedsc", "num-clients": N, "fedsc.dim": DIM,
        "fedsc.passes": 1, "fedsc.views-per-pass": 1, "fedsc.alpha-schedule": "constant",
        "server-eval": False, **extra,
    })  # fmt: skip


class Script:
    """Honest clients release R_k = R + small symmetric noise (R PSD, entries within mu) and
    train to the model plus 1e-3 noise; the clients in BAD release -mu I, at the edge of the
    accepted box and far from PSD, and answer the model plus `huge`."""

    def __init__(self, strategy: FedSC, huge: float, seed: int = 0, bad_r: bool = True) -> None:
        self.strategy = strategy
        self.huge = huge
        self.bad_r = bad_r  # False: the clients in BAD release honest matrices
        self.rng = np.random.default_rng(seed)
        b = self.rng.standard_normal((DIM, DIM))
        self.r = b @ b.T / DIM
        self.r *= 0.5 * strategy.fedsc.mu / np.abs(self.r).max()

    def correlation(self, cid: int) -> np.ndarray:
        if cid in BAD and self.bad_r:
            return -self.strategy.fedsc.mu * np.eye(DIM, dtype=np.float32)
        noise = 0.01 * self.rng.standard_normal((DIM, DIM))
        return (self.r + noise + noise.T).astype(np.float32)

    def trained(self, cid: int, model: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for key, value in model.items():
            if value.dtype.kind != "f":
                out[key] = value + 1
                continue
            step = self.huge if cid in BAD else 1e-3 * self.rng.standard_normal(value.shape)
            out[key] = (value + step).astype(value.dtype)
        return out

    def __call__(self, cid: int, message_type: str, content: RecordDict) -> RecordDict:
        metrics = {protocol.NUM_EXAMPLES: 100 + 10 * cid}
        if message_type == "query.correlation":
            return protocol.reply(content, cid, {}, **{CORRELATION: {"r": self.correlation(cid)}})
        arrays = self.trained(cid, protocol.arrays_of(content))
        return protocol.reply(content, cid, metrics, arrays=arrays)


def _round(
    cfg: dict[str, Any], huge: float, bad_r: bool = True
) -> tuple[FedSC, ScriptedFederation, dict[str, Any]]:
    strategy = FedSC(cfg)
    strategy.initialize(1)
    start = dict(strategy.weights)
    fed = ScriptedFederation(cfg, Script(strategy, huge, bad_r=bad_r), CLIENTS)
    strategy.run_round(fed)
    return strategy, fed, start


def _rbar(fed: ScriptedFederation, cid: int) -> np.ndarray:
    return protocol.arrays_of(fed.sent["train"][cid], OTHERS)["r"].astype(np.float64)


def _stored(fed: ScriptedFederation) -> dict[int, np.ndarray]:
    replies = fed.replies["query.correlation"]
    return {
        c: protocol.arrays_of(r, CORRELATION)["r"].astype(np.float64) for c, r in replies.items()
    }


def test_psd_projection_is_the_nearest_psd_matrix() -> None:
    """Symmetric part with the negative eigenvalues set to 0: PSD, idempotent, unchanged on a
    PSD matrix, and no PSD matrix of a few random ones is nearer; within_bound scales a PSD
    matrix into the box and keeps it PSD."""
    rng = np.random.default_rng(3)
    m = rng.standard_normal((6, 6))
    p = psd_projection(m)
    np.testing.assert_array_equal(p, p.T)
    assert np.linalg.eigvalsh(p).min() > -1e-12
    np.testing.assert_allclose(psd_projection(p), p, atol=1e-12)
    b = rng.standard_normal((6, 3))
    np.testing.assert_allclose(psd_projection(b @ b.T), b @ b.T, atol=1e-12)
    sym = (m + m.T) / 2
    values = np.linalg.eigvalsh(sym)
    assert np.linalg.norm(p - sym) == pytest.approx(np.linalg.norm(np.minimum(values, 0)))
    for _ in range(20):
        c = rng.standard_normal((6, 6))
        assert np.linalg.norm(m - c @ c.T) >= np.linalg.norm(m - p) - 1e-12
    big = 10 * (b @ b.T)
    boxed = within_bound(big, 1.0)
    assert np.abs(boxed).max() == pytest.approx(1.0)
    assert np.linalg.eigvalsh(boxed).min() > -1e-12
    assert within_bound(p, 1e9) is not None and np.array_equal(within_bound(p, 1e9), p)


def test_the_plain_mean_is_the_old_round_bitwise(
    run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With robust.rule=mean and nothing else no combination runs: each client's Rbar_{-j} is
    `others` (the q-weighted mean of the others' stored matrices) and the model the
    examples-weighted mean of the replies, to the bit."""

    def never(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the plain mean must not go through Combiner.combine")

    monkeypatch.setattr(Combiner, "combine", never)
    strategy, fed, _ = _round(_cfg(run_config, **{"robust.rule": "mean"}), huge=1.0)
    stored = _stored(fed)
    q = {c: float(100 + 10 * c) for c in range(N)}
    for cid in range(N):
        expected = others(stored, q, cid)
        assert expected is not None
        np.testing.assert_array_equal(
            protocol.arrays_of(fed.sent["train"][cid], OTHERS)["r"], expected.astype(np.float32)
        )
    replies = fed.replies["train"].values()
    expected_model = weighted_average(
        [protocol.arrays_of(r) for r in replies], [100 + 10 * c for c in range(N)]
    )
    for key, value in expected_model.items():
        np.testing.assert_array_equal(strategy.weights[key], value)


@pytest.mark.parametrize("rule", ["median", "trimmed-mean", "multi-krum", "geomed"])
def test_a_robust_rule_keeps_rbar_psd_and_near_the_honest_one(
    run_config: dict[str, Any], rule: str
) -> None:
    """Two of ten clients release -mu I (accepted: symmetric, inside the box) and answer models
    1e6 away: under the mean, Rbar_{-j} moves by more than 0.5 (Frobenius) from the honest
    clients' mean and the model by 1e5; under the robust rule, Rbar_{-j} is PSD, inside the
    box and within 0.1 of the honest mean, and the model within 1e-2 of the honest mean."""
    robust, fed, start = _round(_cfg(run_config, **{"robust.rule": rule, "robust.f": 2}), 1e6)
    plain, plain_fed, _ = _round(_cfg(run_config, **{"robust.rule": "mean"}), 1e6)
    bound = robust.fedsc.mu + 10 * robust.fedsc.noise_std
    stored = _stored(fed)
    for cid in range(8):
        honest = np.mean([stored[k] for k in range(8) if k != cid], axis=0)
        rbar = _rbar(fed, cid)
        assert np.linalg.eigvalsh(rbar).min() > -1e-6
        assert np.abs(rbar).max() <= bound
        assert np.linalg.norm(rbar - honest) < 0.1
        assert np.linalg.norm(_rbar(plain_fed, cid) - honest) > 0.5
    for key, value in start.items():
        if value.dtype.kind != "f":
            continue
        assert np.abs(robust.weights[key] - value).max() < 1e-2
        assert np.abs(plain.weights[key] - value).max() > 1e5


def test_simulated_attackers_replace_their_matrices_and_rbar_stays_acceptable(
    run_config: dict[str, Any],
) -> None:
    """attack.clients=8,9 (sign-flip, scale 100; the script has them release honest
    matrices): what they release is replaced by -100 times their own matrix, symmetrised and
    clipped to the accepted box, and stored so (the server's validate_correlation accepts
    it). Under the mean Rbar_{-j} moves more than 0.5 from the honest clients' mean yet is
    PSD and inside the box; under the median it stays within 0.1 of the honest mean."""
    attack = {"attack.clients": "8,9", "attack.kind": "sign-flip", "attack.scale": 100.0}
    robust, fed, _ = _round(
        _cfg(run_config, **attack, **{"robust.rule": "median", "robust.f": 2}), 0.0, bad_r=False
    )
    _, plain_fed, _ = _round(_cfg(run_config, **attack), 0.0, bad_r=False)
    bound = robust.fedsc.mu
    released = _stored(fed)
    for cid in BAD:
        stored = robust.latest[cid]
        assert np.abs(stored - released[cid]).max() > 1.0  # replaced
        np.testing.assert_array_equal(stored, stored.T)
        assert np.abs(stored).max() <= bound
        content = protocol.reply(
            fed.sent["query.correlation"][cid], cid, {},
            **{CORRELATION: {"r": stored.astype(np.float32)}},
        )  # fmt: skip
        robust.validate_correlation(cid, content)  # raises InvalidReply if not acceptable
    for cid in range(8):
        honest = np.mean([released[k] for k in range(8) if k != cid], axis=0)
        for rbar in (_rbar(fed, cid), _rbar(plain_fed, cid)):
            assert np.linalg.eigvalsh(rbar).min() > -1e-6
            assert np.abs(rbar).max() <= bound
        assert np.linalg.norm(_rbar(fed, cid) - honest) < 0.1
        assert np.linalg.norm(_rbar(plain_fed, cid) - honest) > 0.5


# ---- learning through the real ServerApp and ClientApp -------------------------------------


def _learn(
    run_config: dict[str, Any], tag: str, extra: Mapping[str, Any], clients: int = N
) -> float | None:
    """The final kNN accuracy of the global encoder (evaluated by the clients on their test
    splits) of a 5-round FedSC run, or None when the run failed."""
    cfg = _cfg(run_config, **{
        "num-clients": clients, "num-rounds": 5, "lr": 0.01, "momentum": 0.9, "batch-size": 32,
        "local-epochs": 3,
        "fedsc.dim": 32, "fedsc.views-per-pass": 2, "fedsc.alpha-schedule": "linear",
        "fedsc.knn-k": 20, "fedsc.probe-epochs": 1, "out-dir": f"{run_config['out-dir']}-{tag}",
        **extra,
    })  # fmt: skip
    grid = FakeGrid(client_app, clients, cfg)
    grid.errors_as_replies = True  # a client that cannot go on answers an error, as a node does
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg)
    with contextlib.suppress(PhaseFailed):  # the summary says the run failed
        server_app(grid, context)
    summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    if summary["status"] != "completed":
        return None
    return float(summary["final"]["eval"]["knn-accuracy"])


@pytest.mark.slow
def test_fedsc_with_two_sign_flipping_clients_learns_like_the_clean_run(
    run_config: dict[str, Any],
) -> None:
    """digits, 10 clients, 5 rounds: clients 8 and 9 flip their model updates and correlation
    matrices and scale them by 100 (at the default 10, the mean's kNN accuracy after 5 rounds
    is only a few points below the clean run's: on digits even a random encoder's kNN
    accuracy is ~0.5, so the attack needs to break the model to show). The trimmed mean
    (f = 2) ends within 3 points of the clean run's kNN accuracy; the mean under the same
    attack fails (the model turns non-finite) or ends 10 points below."""
    attack = {"attack.clients": "8,9", "attack.kind": "sign-flip", "attack.scale": 100.0}
    clean = _learn(run_config, "clean", {}, N - len(BAD))  # the same honest clients and data
    robust = _learn(run_config, "robust", {**attack, "robust.rule": "trimmed-mean", "robust.f": 2})
    attacked = _learn(run_config, "attacked", attack)
    assert clean is not None and robust is not None
    assert robust > clean - 0.03
    assert attacked is None or attacked < clean - 0.1
