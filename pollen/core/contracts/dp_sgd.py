"""DP-SGD's contract between the clients that train with it (client.common, client.dp_sgd) and
the server's copy of their privacy ledgers (strategies.privacy): how many steps a round of local
training takes for a client of n examples, at which sample rate and noise multiplier, and the
names under which the ledger travels and is stored (docs/privacy.md).

A round of local training of a client with n training examples is `passes` (FedEM: one per
component, each trained on the same examples) x `local-epochs` x ceil(n / batch-size) steps at
sample rate q = 1 / ceil(n / batch-size) (models.privacy.poisson_plan). With
`dp.target-epsilon` the noise multiplier is the one that reaches the target after `num-rounds`
such rounds, i.e. if the client trains in every round; a client sampled less often ends below it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pollen.core.protection import DPSettings
from pollen.core.settings import RunSettings, Scalar

if TYPE_CHECKING:
    from models.privacy import PoissonPlan

EPSILON = "epsilon"
"""Metric: the client's epsilon at `dp.delta` after this round (the server's row: the max over
clients of its copies of the ledgers)."""
STEPS = "dp-steps"
"""Metric: the client's DP-SGD steps so far, every round it trained included."""
NOISE = "noise-multiplier"
"""Metric: the noise multiplier the client trained with (calibrated with dp.target-epsilon)."""
LEDGER = "dp-ledger"
"""Client state (meta): the ledger, [[noise multiplier, sample rate, steps], ...]."""
NO_GUARANTEE = -1.0
"""What a metric shows for an infinite epsilon (the metrics files take no infinity)."""


@dataclass(frozen=True)
class ClientDP:
    """DP-SGD as one client runs it, from the run's settings and its number of examples."""

    noise_multiplier: float
    max_grad_norm: float
    delta: float
    reproducible: bool
    plan: PoissonPlan
    steps_per_pass: int
    """local-epochs x steps per epoch: the steps of one training pass over the client's data."""
    passes: int

    @property
    def steps_per_round(self) -> int:
        return self.passes * self.steps_per_pass


def client_dp(settings: Mapping[str, Scalar], examples: int, passes: int = 1) -> ClientDP | None:
    """DP-SGD of a client with `examples` training examples whose round trains `passes` models
    on them (FedEM: its components); None when the run has no DP-SGD."""
    dp = DPSettings.of(settings)
    if not dp.enabled:
        return None
    from models.privacy import noise_for_epsilon, poisson_plan  # lazy: torch (models), opacus

    run = RunSettings.of(settings)
    plan = poisson_plan(examples, run.batch_size)
    per_pass = run.local_epochs * plan.steps_per_epoch
    z = dp.noise_multiplier
    if dp.target_epsilon > 0:
        planned = run.num_rounds * passes * per_pass
        z = noise_for_epsilon(dp.target_epsilon, dp.delta, plan.sample_rate, planned)
    return ClientDP(z, dp.max_grad_norm, dp.delta, dp.reproducible, plan, per_pass, passes)


def shown(epsilon: float) -> float:
    """An epsilon as the metrics carry it: NO_GUARANTEE for infinity."""
    return epsilon if epsilon != float("inf") else NO_GUARANTEE
