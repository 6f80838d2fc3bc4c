"""ADEPT's oracles through the real halves (client.adept, strategies.adept) on the engine,
in-process: clients with identical data stay identical, and the FedAvg baseline with one
full-batch step per round is centralised gradient descent (Ozkara et al., AISTATS 2025).
Restart-and-resume is in tests/server/test_resume_every_algorithm.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Message, RecordDict

import federated_data
from client.app import app as client_app
from client.env import ClientEnv
from client.state import StateStore
from federated_data import load_client_data
from models.autoencoder import LinearAutoencoder
from models.stiefel import retract, tangent_projection
from pollen.core import protocol
from pollen.core.dataspec import data_spec
from pollen.core.registry import get_algorithm
from server.engine import Engine
from server.results import ResultsWriter
from strategies.adept import ADEPT
from strategies.base import strategy_class
from tests.fakes import FakeClock, FakeGrid, settings_of

Replies = dict[tuple[int, int], dict[str, dict[str, np.ndarray]]]


def _run(cfg: dict[str, Any]) -> tuple[ADEPT, Replies, dict[str, np.ndarray]]:
    """An engine run on one fake node per client: (strategy after the run, every train reply's
    mu and sigma by (round, client), the server's initial mu)."""
    strategy = strategy_class(get_algorithm(cfg["algorithm"]))(cfg)
    assert isinstance(strategy, ADEPT)
    grid = FakeGrid(client_app, int(cfg["num-clients"]), cfg)
    replies: Replies = {}

    def record(node: int, msg: Message, _reply: RecordDict | None) -> Any:
        if msg.metadata.message_type != "train":
            return None
        key = (protocol.round_of(msg.content), node - 100)

        def keep(content: RecordDict) -> RecordDict:
            replies[key] = {n: protocol.arrays_of(content, n) for n in ("mu", "sigma")}
            return content

        return keep

    grid.faults.append(record)
    strategy.initialize(int(cfg["seed"]))
    initial = {k: v.copy() for k, v in strategy.mu.items()}
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    return strategy, replies, initial


def _client_state(cfg: dict[str, Any], cid: int) -> dict[str, np.ndarray]:
    saved = StateStore(Path(cfg["out-dir"]) / "client-state" / "test" / f"client-{cid}").load(99)
    assert saved is not None and saved[1]["round"] == cfg["num-rounds"]
    return saved[0]


PCA = {"algorithm": "adept-pca", "dataset": "pca-synthetic", "partitioner": "natural",
       "val-fraction": 0.0, "synthetic.dimension": 12, "synthetic.rank": 3,
       "synthetic.train-size": 10, "synthetic.test-size": 20, "adept-pca.rank": 3, "lr": 2e-3,
       "adept.lr-global": 0.5, "adept.lr-sigma": 1e-4, "adept.sigma-init": 0.5}  # fmt: skip
AE = {"algorithm": "adept-ae", "partitioner": "classes", "classes-per-client": 1,
      "adept-ae.latent": 4, "adept-ae.local-steps": 3, "adept-ae.lazy-rounds": 1, "lr": 0.01,
      "momentum": 0.9, "persist-momentum": True}  # fmt: skip


@pytest.mark.parametrize("variant", ["pca", "ae"])
def test_clients_with_identical_data_keep_identical_theta_mu_and_sigma(
    run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """Hierarchical model of Sec. 2.1: two clients holding the same data, starting from the same
    point and drawing the same minibatches are exchangeable, so after every round of
    Algorithm 1 (ADEPT-AE) / Algorithm 2 (ADEPT-PCA, App. C) their personal models theta_i, the
    mu_i and sigma_i they send, and their optimizer state are equal bit for bit, and the
    server's 1/m means of sigma (and of mu, for AE) are the clients' values.

    Client 1 is given client 0's partition. ADEPT-PCA starts U_i at the top eigenvectors of S_i
    and uses no random numbers; ADEPT-AE draws its personal initialisation and minibatch order
    from per-client seeds, which are made client-independent here (the paper's setting of two
    such clients: same start, same minibatches)."""
    real_load = federated_data.load_client_data
    monkeypatch.setattr(
        federated_data, "load_client_data", lambda spec, _cid, cache: real_load(spec, 0, cache)
    )
    if variant == "ae":
        real_seed = ClientEnv.seed
        monkeypatch.setattr(
            ClientEnv,
            "seed",
            lambda self, rnd, tag: real_seed(SimpleNamespace(run=self.run, cid=0), rnd, tag),  # type: ignore[arg-type]
        )
    cfg = settings_of({**run_config, **(PCA if variant == "pca" else AE), "num-clients": 2,
                       "num-rounds": 3, "server-eval": False, "final-eval": False})  # fmt: skip
    strategy, replies, initial = _run(cfg)
    assert sorted(replies) == [(r, c) for r in (1, 2, 3) for c in (0, 1)]
    for rnd in (1, 2, 3):
        for record in ("mu", "sigma"):
            first, second = replies[rnd, 0][record], replies[rnd, 1][record]
            assert sorted(first) == sorted(second)
            for key, value in first.items():
                np.testing.assert_array_equal(second[key], value, err_msg=f"{rnd} {record}.{key}")
    theta0, theta1 = _client_state(cfg, 0), _client_state(cfg, 1)
    assert sorted(theta0) == sorted(theta1)
    for key, value in theta0.items():  # U_i or theta_i, sigma_i, momentum buffers
        np.testing.assert_array_equal(theta1[key], value, err_msg=key)
    last = replies[3, 0]
    for key, value in strategy.sigma.items():
        np.testing.assert_array_equal(value, last["sigma"][key], err_msg=key)
    if variant == "ae":
        for key, value in strategy.mu.items():
            np.testing.assert_array_equal(value, last["mu"][key], err_msg=key)
        assert any(k.startswith("momentum.") for k in theta0)
    # none of it is vacuous: sigma, mu and the personal models all moved
    sigma0 = float(cfg["adept.sigma-init"])
    assert any(not np.allclose(v, sigma0) for v in strategy.sigma.values())
    assert any(not np.allclose(strategy.mu[k], initial[k]) for k in initial)
    personal = [k for k in theta0 if k == "U" or k.startswith("theta.")]
    assert personal


def test_identical_data_alone_does_not_make_autoencoder_clients_identical(
    run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control of the test above: with per-client seeds (the authors' distinct personal
    initialisations) the same data gives different theta_i, so the equality there is not
    automatic."""
    real_load = federated_data.load_client_data
    monkeypatch.setattr(
        federated_data, "load_client_data", lambda spec, _cid, cache: real_load(spec, 0, cache)
    )
    cfg = settings_of({**run_config, **AE, "num-clients": 2, "num-rounds": 1,
                       "server-eval": False, "final-eval": False})  # fmt: skip
    _run(cfg)
    theta0, theta1 = _client_state(cfg, 0), _client_state(cfg, 1)
    assert not np.allclose(theta0["theta.decoder.weight"], theta1["theta.decoder.weight"])


def _inputs(cfg: dict[str, Any], cid: int) -> np.ndarray:
    """A client's training inputs as ADEPT's clients read them (images scaled to [0, 1])."""
    x = load_client_data(data_spec(cfg), cid, Path(cfg["cache-dir"])).train.x
    return x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x


def _gradient_descent(
    params: list[torch.Tensor],
    objectives: list[Callable[[], torch.Tensor]],
    lr: float,
    steps: int,
) -> None:
    """`steps` steps of gradient descent on (1/m) sum_i objectives[i], in place."""
    for _ in range(steps):
        total = [torch.zeros_like(p) for p in params]
        for objective in objectives:
            grads = torch.autograd.grad(objective(), params)
            total = [t + g / len(objectives) for t, g in zip(total, grads, strict=True)]
        with torch.no_grad():
            for p, g in zip(params, total, strict=True):
                p -= lr * g


def test_fedavg_autoencoder_with_one_full_batch_step_is_centralised_gradient_descent(
    run_config: dict[str, Any],
) -> None:
    """The FedAvg baseline of Sec. 5.1 (global training) with tau = 1 local iteration on the
    full local batch: each round is one gradient step on f = (1/m) sum_i f_i, f_i the mean
    reconstruction error ||x - psi(g(x))||^2 of client i (Sec. 2.2, Eq. 6 without the prior),
    because every client starts from mu and the server takes the unweighted mean (Algorithm 1,
    line 22). Clients hold different numbers of images, so a mean weighted by examples
    would not match. The l_inf gradient clip of the experiments (App. F.2) is off: it would
    clip each client's gradient on its own. Float32 clients against a float64 reference."""
    lr, rounds = 0.01, 3
    cfg = settings_of({**run_config, **AE, "adept.method": "fedavg", "num-clients": 3,
                       "num-rounds": rounds, "adept-ae.local-steps": 1, "momentum": 0.0,
                       "adept-ae.grad-clip": 0.0, "lr": lr, "server-eval": False,
                       "final-eval": False})  # fmt: skip
    strategy, _, initial = _run(cfg)
    xs = [torch.from_numpy(_inputs(cfg, c)).double() for c in range(3)]
    assert len({len(x) for x in xs}) > 1  # unequal client sizes
    model = LinearAutoencoder(tuple(xs[0].shape[1:]), int(cfg["adept-ae.latent"])).double()
    model.load_state_dict({k: torch.from_numpy(v).double() for k, v in initial.items()})

    def reconstruction(x: torch.Tensor) -> Callable[[], torch.Tensor]:
        return lambda: ((x - model(x)) ** 2).flatten(1).sum(1).mean()

    _gradient_descent(list(model.parameters()), [reconstruction(x) for x in xs], lr, rounds)
    moved = 0.0
    for key, value in model.state_dict().items():
        np.testing.assert_allclose(strategy.mu[key], value.numpy(), rtol=1e-5, atol=1e-6)
        moved = max(moved, float(np.abs(value.numpy() - initial[key]).max()))
    assert moved > 1e-2


def test_fedavg_pca_with_one_step_is_centralised_riemannian_gradient_descent(
    run_config: dict[str, Any],
) -> None:
    """ADEPT-PCA's global baseline (App. F.1): one V for everyone; a client takes the Riemannian
    gradient of its data term (n_i/2)(logdet W + tr(W^-1 S_i)) at V (Sec. 2.2, Eq. 4 without the
    prior) and the server retracts the unweighted mean step (Algorithm 2, App. C). Each round
    is thus one Riemannian gradient step with the polar retraction (Remark 3.4) on
    (1/m) sum_i of the data terms, whose gradient is taken here by autograd on the formula."""
    lr, rounds = 1e-3, 3
    cfg = settings_of({**run_config, **PCA, "adept.method": "fedavg", "num-clients": 3,
                       "num-rounds": rounds, "lr": lr, "server-eval": False,
                       "final-eval": False})  # fmt: skip
    strategy, _, initial = _run(cfg)
    noise = float(cfg["adept-pca.noise"])
    xs = [torch.from_numpy(_inputs(cfg, c).reshape(-1, 12)).double() for c in range(3)]
    v = initial["V"]
    for _ in range(rounds):
        vt = torch.tensor(v, requires_grad=True)
        w = vt @ vt.T + noise**2 * torch.eye(12, dtype=torch.float64)
        mean = torch.stack([
            0.5 * len(x) * (torch.logdet(w) + torch.trace(torch.linalg.solve(w, x.T @ x / len(x))))
            for x in xs
        ]).mean()  # fmt: skip
        (grad,) = torch.autograd.grad(mean, vt)
        v = retract(v, -lr * tangent_projection(v, grad.numpy()))
    np.testing.assert_allclose(strategy.mu["V"], v, atol=1e-10)
    assert np.abs(v - initial["V"]).max() > 1e-3
