"""FedSC's gradient alignment (Jing et al., ICML 2024, Sec. 4, Eqs. 4-6) through the real
halves: a round of client.fedsc (DP-CalR without noise, then local steps on Eq. 5) and
strategies.fedsc (Rbar_{-j}, alpha = q_j, averaging by examples) on the engine, in-process,
against centralised gradient descent on the global spectral contrastive objective (Eq. 1) over
the union of the clients' data, computed here in float64.

The setting the identity needs: full-batch steps, no momentum, weight decay or gradient clip,
representations never clipped (mu large), an encoder without BatchNorm ('cnn-gn': train and eval
mode compute the same function), and augmentations that are the same views in DP-CalR and in
training. The augmentation is replaced by a deterministic one (`TwoViews`): with random views
the identity only holds in expectation. Everything else is the code a run executes."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import client.fedsc
import strategies.fedsc
from client.app import app as client_app
from federated_data import load_client_data
from models.spectral import aggregate, global_objective, local_objective, norm_clip
from pollen.core.contracts.fedsc import FedSCSettings
from pollen.core.dataspec import data_spec
from server.engine import Engine
from server.results import ResultsWriter
from strategies.fedsc import FedAvgSC, FedSC
from tests.fakes import FakeClock, FakeGrid, settings_of

Weights = dict[str, np.ndarray]
SCALE = 1.5
"""The projector's last layer is scaled by this at initialisation: with larger representations
the contrast terms, where FedAvg + SC's error comes from, weigh more against the contraction
term (FedAvg + SC's round is 1.6% off the centralised step here, 0.6% without the scaling), so
that its first-order error stands out of the second-order drift of local steps."""


def mirror(x: torch.Tensor) -> torch.Tensor:
    return torch.flip(x, dims=[-1])


class TwoViews:
    """The augmentation of these tests: the images themselves, then their horizontal mirror,
    alternately. DP-CalR (one pass, two views per pass, one batch) and every local step (view 1,
    view 2) each draw one of each, so R_j of the shared matrix and of the objective are the same
    matrix."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: torch.Tensor, _generator: torch.Generator) -> torch.Tensor:
        self.calls += 1
        return x if self.calls % 2 else mirror(x)


def _scaled(base: type[FedSC]) -> type[FedSC]:
    class Scaled(base):  # type: ignore[valid-type,misc]
        def initialize(self, seed: int) -> None:
            super().initialize(seed)
            self.weights["projector.2.weight"] = self.weights["projector.2.weight"] * SCALE

    return Scaled


VARIANTS = ("fedsc", "fedavg-sc", "half-cross-term", "global-r")


@pytest.fixture(autouse=True)
def two_views(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client.fedsc, "_augmenter", lambda _env: TwoViews())


def _break(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative controls of Eq. 6, put into the real code: the cross term with the 1/2 of
    Eq. 4 that Eq. 5 drops (Tr(R_j Rbar/2)), or the global R (own R_j included) where Eq. 5 has
    R_{-j}."""
    if variant == "half-cross-term":
        real = local_objective

        def halved(
            z1: torch.Tensor, z2: torch.Tensor, alpha: float, others: torch.Tensor | None = None
        ) -> torch.Tensor:
            return real(z1, z2, alpha, None if others is None else others / 2)

        monkeypatch.setattr(client.fedsc, "local_objective", halved)
    elif variant == "global-r":
        monkeypatch.setattr(
            strategies.fedsc, "others", lambda latest, q, _cid: aggregate(latest, q)
        )


def _settings(run_config: dict[str, Any], variant: str, lr: float, steps: int) -> dict[str, Any]:
    tag = f"{variant}-{lr:g}-{steps}"
    return settings_of({
        **run_config, "algorithm": "fedavg-sc" if variant == "fedavg-sc" else "fedsc",
        "num-clients": 3, "num-rounds": 1, "partitioner": "one-class",
        "classes-per-client": 1, "lr": lr,
        "local-epochs": steps, "batch-size": 1000, "momentum": 0.0, "weight-decay": 0.0,
        "fedsc.encoder": "cnn-gn", "fedsc.dim": 8, "fedsc.hidden": 16, "fedsc.mu": 1e6,
        "fedsc.passes": 1, "fedsc.views-per-pass": 2, "fedsc.alpha-schedule": "q",
        "fedsc.weighting": "examples", "fedsc.noise-std": 0.0, "fedsc.grad-clip": 0.0,
        "fedsc.knn-k": 5, "server-eval": False, "final-eval": False,
        "out-dir": f"{run_config['out-dir']}-{tag}", "run-name": tag,
    })  # fmt: skip


def _round(cfg: dict[str, Any]) -> tuple[Weights, Weights]:
    """(initial weights, weights after one round) of an engine run on 3 fake nodes."""
    strategy = _scaled(FedAvgSC if cfg["algorithm"] == "fedavg-sc" else FedSC)(cfg)
    strategy.initialize(int(cfg["seed"]))
    initial = {k: v.copy() for k, v in strategy.weights.items()}
    grid = FakeGrid(client_app, 3, cfg)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    return initial, strategy.weights


def _central(cfg: dict[str, Any], initial: Weights) -> Weights:
    """`local-epochs` steps of gradient descent (float64, the clients' learning rate and loss
    scale) on L = -Tr(sum_j q_j R+_j) + 1/2 ||sum_j q_j R_j||^2, q_j = |D_j| / |D|, over the
    same two views of every client's images."""
    net = FedSC(cfg).evaluator.net(initial).double().train()
    spec, cache = data_spec(cfg), Path(cfg["cache-dir"])
    xs = [torch.from_numpy(load_client_data(spec, c, cache).train.features()).double()
          for c in range(3)]  # fmt: skip
    q = [len(x) / sum(len(y) for y in xs) for x in xs]
    assert len({len(x) for x in xs}) > 1  # unequal q_j
    fedsc = FedSCSettings.of(cfg)
    params = list(net.parameters())
    for _ in range(int(cfg["local-epochs"])):
        views = [(norm_clip(net(x), fedsc.mu), norm_clip(net(mirror(x)), fedsc.mu)) for x in xs]
        grads = torch.autograd.grad(fedsc.loss_scale * global_objective(views, q), params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p -= float(cfg["lr"]) * g
    return {k: v.detach().numpy() for k, v in net.state_dict().items()}


def _errors(run_config: dict[str, Any], variant: str, lr: float, steps: int) -> tuple[float, float]:
    """(||theta_round - theta_central||, that over ||theta_central - theta_start||)."""
    cfg = _settings(run_config, variant, lr, steps)
    initial, after = _round(cfg)
    central = _central(cfg, initial)

    def norm(a: Weights, b: Weights) -> float:
        return float(np.sqrt(sum(((a[k].astype(np.float64) - b[k]) ** 2).sum() for k in b)))

    error = norm(after, central)
    return error, error / norm(initial, central)


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_round_of_one_local_step_is_one_centralised_gradient_step(
    run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """Eq. 6: with alpha_j = q_j and Rbar_{-j} = R_{-j}(theta) (fresh, Alg. 1 lines 4-20), the
    q-weighted mean of the clients' gradients of Eq. 5 is the gradient of the global objective,
    so a round of one local step and q-weighted averaging (Eq. 6's weights; Alg. 1 line 23
    averages uniformly, the same for equal |D_j|) is one centralised gradient step:
    equal up to float32 rounding (observed: 1e-5 and 2e-5 of the step) at every learning rate.
    FedAvg + SC (Eq. 3: the sum of the local objectives is not the global one) and the two
    broken variants of Eq. 5 miss it by an error proportional to the step (observed: 1.6e-2,
    0.17 with half the cross term, 5.3e-3 with the global R): halving the learning rate halves
    the error (first order), it does not quarter it."""
    _break(variant, monkeypatch)
    big, rel_big = _errors(run_config, variant, 4e-3, 1)
    small, rel_small = _errors(run_config, variant, 2e-3, 1)
    if variant == "fedsc":
        assert max(rel_big, rel_small) < 1e-4
    else:
        assert min(rel_big, rel_small) > 1e-3
        assert big / small == pytest.approx(2.0, rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["fedsc", "fedavg-sc"])
def test_with_two_local_steps_fedsc_errs_at_second_order_and_fedavg_sc_at_first(
    run_config: dict[str, Any], variant: str
) -> None:
    """With local steps FedSC's Rbar_{-j} ages and the clients drift within the round; both move
    the round off the centralised steps by O(eta^2) only (the aging argument after Eq. 6,
    Sec. 5), while FedAvg + SC keeps its first-order error: halving eta divides FedSC's error by
    about 4 (observed 4.7, 4.2) and FedAvg + SC's by about 2 (observed 2.2, 2.1). (The global-R
    control's first-order error is a third of FedAvg + SC's and hides under the second-order
    drift at these steps; the test above isolates it.)"""
    errors = [_errors(run_config, variant, lr, 2)[0] for lr in (1e-3, 5e-4, 2.5e-4)]
    ratios = [a / b for a, b in itertools.pairwise(errors)]
    if variant == "fedsc":
        assert min(ratios) > 3.3, ratios
    else:
        assert max(ratios) < 2.6, ratios
