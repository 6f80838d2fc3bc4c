"""Byzantine-robust ADEPT (issue #34; strategies/adept.py's module docstring): the plain mean
is bitwise the old server step; a robust rule combines (mu, log sigma) jointly, keeps sigma
positive and near the honest clients', and ADEPT-PCA's V on the Stiefel manifold; a short
ADEPT-PCA run on pca-synthetic with two sign-flipping clients of ten ends as the clean run."""

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
from models.adept_ae import average
from models.adept_pca import server_update
from models.stiefel import retract, tangent_projection
from pollen.core import protocol
from server.app import app as server_app
from server.engine import PhaseFailed
from strategies.adept import ADEPT, ADEPTAE, ADEPTPCA
from strategies.base import ClientInfo
from strategies.robust import Combiner
from tests.fakes import FakeGrid, ScriptedFederation, settings_of

N, BAD = 10, (8, 9)

CLIENTS = [ClientInfo(c, 100 + c, 100, 0, 10) for c in range(N)]


def _pca(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return settings_of({
        **run_config, "algorithm": "adept-pca", "dataset": "pca-synthetic",
        "partitioner": "natural", "val-fraction": 0.0, "num-clients": N, "num-rounds": 6,
        "synthetic.dimension": 12, "synthetic.rank": 3, "synthetic.noise": 0.2,
        "synthetic.heterogeneity": 0.1, "synthetic.train-size": 10, "synthetic.test-size": 50,
        "adept-pca.rank": 3, "adept-pca.noise": 0.2, "lr": 2e-3, "adept.lr-global": 0.5,
        "adept.lr-sigma": 1e-6, "adept.sigma-init": 0.1, "server-eval": False, **extra,
    })  # fmt: skip


def _ae(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return settings_of({**run_config, "algorithm": "adept-ae", "num-clients": N,
                        "adept-ae.latent": 4, "adept.sigma-init": 1.0, **extra})  # fmt: skip


class Script:
    """Honest clients answer mu plus a small step and sigma times 1 + 1% noise; the clients in
    BAD answer mu + `huge` and sigma `huge` (client 8) or 1 / `huge` (client 9): finite and
    positive, so that the server's checks pass them."""

    def __init__(self, strategy: ADEPT, huge: float, seed: int = 0) -> None:
        self.strategy = strategy
        self.huge = huge
        self.rng = np.random.default_rng(seed)

    def __call__(self, cid: int, _message_type: str, content: RecordDict) -> RecordDict:
        s = self.strategy
        mu, sigma = {}, {}
        for key, value in s.mu.items():
            step = 0.01 * self.rng.standard_normal(value.shape)
            if s.pca:
                step = tangent_projection(value, step)
            mu[key] = (value + (self.huge if cid in BAD else step)).astype(value.dtype)
        for key, value in s.sigma.items():
            noise = 1 + 0.01 * self.rng.standard_normal(value.shape)
            bad = self.huge if cid == BAD[0] else 1 / self.huge
            sigma[key] = (np.full_like(value, bad) if cid in BAD else value * noise).astype(
                value.dtype
            )
        return protocol.reply(content, cid, {protocol.NUM_EXAMPLES: 10}, mu=mu, sigma=sigma)


def _round(strategy: ADEPT, huge: float) -> ScriptedFederation:
    strategy.initialize(1)
    fed = ScriptedFederation(strategy.settings, Script(strategy, huge), CLIENTS)
    strategy.run_round(fed)
    return fed


@pytest.mark.parametrize("variant", ["pca", "ae"])
def test_the_plain_mean_is_the_old_server_step_bitwise(
    run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """With robust.rule=mean and nothing else no combination runs and mu, sigma are the old
    formulas' (server_update's retracted mean of V, the plain mean of sigma) to the bit."""

    def never(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the plain mean must not go through Combiner.combine")

    monkeypatch.setattr(Combiner, "combine", never)
    cfg = (_pca if variant == "pca" else _ae)(run_config, **{"robust.rule": "mean"})
    strategy: ADEPT = ADEPTPCA(cfg) if variant == "pca" else ADEPTAE(cfg)
    strategy.initialize(1)
    v0 = dict(strategy.mu)
    fed = _round(strategy, huge=1e3)
    mus = [protocol.arrays_of(r, "mu") for r in fed.last.values()]
    sigmas = [protocol.arrays_of(r, "sigma") for r in fed.last.values()]
    expected = (
        {"V": server_update(v0["V"], [m["V"] for m in mus])} if strategy.pca else average(mus)
    )
    for key, value in expected.items():
        np.testing.assert_array_equal(strategy.mu[key], value)
    for key, value in average(sigmas).items():
        np.testing.assert_array_equal(strategy.sigma[key], value)
    if strategy.pca:  # the old server step, written out: R(V, mean_i V_i - V)
        old = retract(v0["V"], np.mean(np.stack([m["V"] for m in mus]), axis=0) - v0["V"])
        np.testing.assert_array_equal(strategy.mu["V"], old)


def _honest(strategy: ADEPT, fed: ScriptedFederation, start: Mapping[str, np.ndarray]) -> Any:
    """The plain server step over the honest replies only."""
    good = [r for cid, r in fed.last.items() if cid not in BAD]
    mus = [protocol.arrays_of(r, "mu") for r in good]
    sigma = average([protocol.arrays_of(r, "sigma") for r in good])
    mu = {"V": server_update(start["V"], [m["V"] for m in mus])} if strategy.pca else average(mus)
    return mu, sigma


@pytest.mark.parametrize("rule", ["median", "trimmed-mean", "krum", "geomed", "centered-clip"])
def test_pca_under_huge_replies_keeps_sigma_positive_and_v_on_the_manifold(
    run_config: dict[str, Any], rule: str
) -> None:
    """Two of ten ADEPT-PCA clients answer V + 1e6 and sigma 1e6 or 1e-6: the mean's sigma
    moves by orders of magnitude and its V far from the honest step; the robust rule's sigma
    is positive and within 5% of the honest mean's, its V orthonormal (error < 1e-10) and
    within 0.05 of the honest step's."""
    cfg = _pca(run_config, **{"robust.rule": rule, "robust.f": 2, "robust.tau": 0.1})
    strategy = ADEPTPCA(cfg)
    strategy.initialize(1)
    start = dict(strategy.mu)
    fed = _round(strategy, huge=1e6)
    mu, sigma = _honest(strategy, fed, start)
    v = strategy.mu["V"]
    assert np.abs(v.T @ v - np.eye(3)).max() < 1e-10
    assert np.linalg.norm(v @ v.T - mu["V"] @ mu["V"].T) < 0.05
    s, honest = float(strategy.sigma["V"][0]), float(sigma["V"][0])
    assert s > 0 and abs(s - honest) < 0.05 * honest

    plain = ADEPTPCA(_pca(run_config))
    plain_fed = _round(plain, huge=1e6)
    mu, sigma = _honest(plain, plain_fed, start)
    assert float(plain.sigma["V"][0]) > 1e4 * float(sigma["V"][0])
    assert np.linalg.norm(plain.mu["V"] @ plain.mu["V"].T - mu["V"] @ mu["V"].T) > 0.5


def test_ae_under_huge_replies_keeps_every_sigma_near_the_honest_one(
    run_config: dict[str, Any],
) -> None:
    """ADEPT-AE, per-weight sigma: the trimmed mean of log sigma stays within 5% of the honest
    mean of sigma for every weight, mu within 0.01 of the honest mean."""
    strategy = ADEPTAE(_ae(run_config, **{"robust.rule": "trimmed-mean", "robust.f": 2}))
    strategy.initialize(1)
    start = dict(strategy.mu)
    fed = _round(strategy, huge=1e6)
    mu, sigma = _honest(strategy, fed, start)
    for key, value in sigma.items():
        assert strategy.sigma[key].dtype == value.dtype
        assert (strategy.sigma[key] > 0).all()
        np.testing.assert_allclose(strategy.sigma[key], value, rtol=0.05)
        assert np.abs(strategy.mu[key] - mu[key]).max() < 0.01


def test_fedavg_baseline_combines_mu_alone(
    run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """adept.method=fedavg: one combination of mu only; sigma is left as it was."""
    points: list[list[str]] = []
    combine = Combiner.combine

    def spy(self: Combiner, rnd: int, point: str, rows: Any, ref: Any = None, w: Any = None) -> Any:
        points.append(sorted(ref))
        return combine(self, rnd, point, rows, ref, w)

    monkeypatch.setattr(Combiner, "combine", spy)
    cfg = _pca(run_config, **{"robust.rule": "median", "robust.f": 2, "adept.method": "fedavg"})
    strategy = ADEPTPCA(cfg)
    _round(strategy, huge=1e6)
    assert points == [["mu/V"]]
    assert float(strategy.sigma["V"][0]) == 0.1


# ---- learning through the real ServerApp and ClientApp -------------------------------------


def _learn(
    run_config: dict[str, Any], tag: str, extra: Mapping[str, Any], clients: int = N
) -> np.ndarray | None:
    """The final global V of a 20-round ADEPT-PCA run on digits, or None when the run failed."""
    cfg = settings_of({
        **run_config, "algorithm": "adept-pca", "num-clients": clients, "num-rounds": 20,
        "adept-pca.rank": 4, "lr": 1e-3, "adept.lr-global": 0.005, "adept.lr-sigma": 1e-6,
        "adept.sigma-init": 0.1, "server-eval": False,
        "out-dir": f"{run_config['out-dir']}-{tag}", **extra,
    })  # fmt: skip
    grid = FakeGrid(client_app, clients, cfg)
    grid.errors_as_replies = True  # a client that cannot go on answers an error, as a node does
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg)
    with contextlib.suppress(PhaseFailed):  # the summary says the run failed
        server_app(grid, context)
    summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    if summary["status"] != "completed":
        return None
    with np.load(Path(cfg["out-dir"]) / "final_model.npz") as final:
        return np.asarray(final["V"])


def _subspace_distance(a: np.ndarray, b: np.ndarray) -> float:
    """||A A^T - B B^T||_F: 0 for the same subspace, sqrt(2 r) for orthogonal ones."""
    return float(np.linalg.norm(a @ a.T - b @ b.T))


@pytest.mark.slow  # 8-15 s alone, far more on a shared machine
def test_adept_pca_with_two_sign_flipping_clients_learns_like_the_clean_run(
    run_config: dict[str, Any],
) -> None:
    """ADEPT-PCA on digits (d = 64, r = 4), 20 rounds: clients 8 and 9 flip and scale by 10
    their V and log sigma updates. The metric is the global model's own: the subspace
    distance ||V V^T - V_c V_c^T||_F of the final V to the clean run's V_c (sqrt(8) ~ 2.83 for
    orthogonal subspaces); the clients' evaluation measures their personal U_i, which start
    from their local optimum and barely feel V in a short run. pca-synthetic, the issue's
    choice, cannot run attackers today: client.adept's `_pca_metrics` indexes the true
    subspaces by client id, not by partition (see the report of this change). The median
    (f = 2) ends within 0.6 of the clean V (it combines 8 honest rows and 2 copies of
    honest data where the clean run means 8: not the same update) and on St(d, r); the mean
    under the same attack drives sigma to 0 and the run fails, or ends 1.0 away."""
    attack = {"attack.clients": "8,9", "attack.kind": "sign-flip"}
    clean = _learn(run_config, "clean", {}, N - len(BAD))  # the same honest clients and data
    robust = _learn(run_config, "robust", {**attack, "robust.rule": "median", "robust.f": 2})
    attacked = _learn(run_config, "attacked", attack)
    assert clean is not None and robust is not None
    assert np.abs(robust.T @ robust - np.eye(4)).max() < 1e-10
    assert _subspace_distance(robust, clean) < 0.6
    assert attacked is None or _subspace_distance(attacked, clean) > 1.0
