"""Client-level DP's contract between the server's aggregation (strategies.robust), its
accounting (strategies.privacy) and, when the noise is added on the clients
(`client-dp.noise-at=client`), the clients (client.dispatch): the mechanism a run's settings
ask for, the noise multiplier a target epsilon calls for, and the names of its metrics
(docs/privacy.md#client-level-dp).

Server-side noise: every round releases the clipped, noised sum of the sampled clients'
updates, a sampled Gaussian mechanism at noise multiplier z and sampling rate q =
`fraction-train` (each training client sampled independently with probability q: Poisson
sampling, as the analysis assumes), neighbouring federations differing by one client added or
removed. Its epsilon after T rounds is the RDP analysis of models.privacy on [(z, q, T)].
With `round.over-selection` o, each client is sampled with probability q' = min(1, q (1 + o))
and the round keeps the first ceil(q N) valid replies: one client's presence can push another's
update out of the sum, so a neighbouring federation moves the sum by up to 2C (its update in,
another's out), and the round is the sampled Gaussian mechanism at z / 2 and rate q' (the
mixture over who else was sampled and when each arrived keeps the analysis: Renyi divergence
is jointly convex). Its epsilon after T rounds is that of [(z / 2, q', T)].
Under FedBuff (`async.buffer` K: docs/pacing.md#buffered-asynchronous-aggregation) there is no
sample: each model version releases the clipped, noised sum of its buffer's K staleness-weighted
updates (each weight at most 1) over the fixed denominator K. Who is handed a model when, and
when each reply comes, is taken to be independent of the clients' data (their devices and
their numbers of examples set it); neighbouring federations then differ in everything one
client holds, its place in the schedule kept, and since a version takes at most one reply of
each client (server.buffered) its sum moves by up to 2C: every version is the Gaussian
mechanism at z / 2 with no amplification, and T versions spend [(z / 2, 1, T)], whichever
versions a client's replies went into (the accounting of noise on the clients, below, with the
noise of one sum rather than of every update).

Client-side noise: each client sends its update clipped to C plus N(0, (z C)^2). The server
sees that row: against it, replacing everything the client holds moves the clipped update by
up to 2C, the Gaussian mechanism at noise multiplier z / 2, once in every round the client
trains, with no amplification by sampling (the server knows whom it asked). Its epsilon after
T rounds is that of [(z / 2, 1, T)]; whatever the server computes from the rows is
post-processing and spends nothing more.

Distributed noise (client-side noise with secure aggregation, `secagg.enabled`): each of the n
clients of a round's sum clips its update to C and adds 1/n of the noise as integers (Skellam,
secagg.noise), so the unmasked sum carries the central mechanism's noise and the server never
sees less; clients are Poisson-sampled and the mean is over m = q N, as with the noise on the
server. A round releases the Skellam mechanism on the survivors' sum, its variance the
survivors' share (models.privacy.distributed_epsilon); the ledger (strategies.privacy) counts
what each round's sum actually carried. With over-selection each client adds 1/k of the noise,
k = ceil(q N) the arrivals the sum keeps, and the release is accounted as on the server (rate
q', twice the sensitivity).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from pollen.core.pacing import AsyncSettings, RoundSettings
from pollen.core.protection import ClientDPSettings, SecAggSettings
from pollen.core.settings import RunSettings, Scalar

EPSILON = "client-epsilon"
"""Metric: the client-level epsilon at `client-dp.delta` after this round (-1: none)."""
EPSILON_VS_SERVER = "client-epsilon-vs-server"
"""Metric (distributed noise): the epsilon against the server, which knows whom it sampled:
every round without amplification by sampling."""
CLIP = "client-dp-clip"
"""Metric: the clipping bound of this round's updates."""
NOISE_STD = "client-dp-noise-std"
"""Metric: the noise's standard deviation on each coordinate of the released mean update."""
UNCLIPPED = "client-dp-unclipped"
"""Metric (adaptive clipping): the released, noised share of updates the bound left unclipped."""
STATE = "client-dp"
"""Checkpoint meta: the mechanism's state (the adaptive bound, the rounds accounted)."""


@dataclass(frozen=True)
class Mechanism:
    """Client-level DP as a run's settings ask for it."""

    noise_multiplier: float
    """z: the noise's standard deviation on the sum, in units of the clipping bound."""
    clip: float
    """C: the (first) clipping bound."""
    delta: float
    sample_rate: float
    """q: each training client takes part in a round with this probability (server side), 1
    for the accounting of client-side noise and under FedBuff."""
    clients: int
    """N: the training clients (all but the held-out unseen ones)."""
    at_client: bool
    """The noise is added by each client to its own update."""
    distributed: bool = False
    """With `at_client`: the clients' noise is shared out in a secure sum (the module's
    text), not added whole to each update."""
    unit: float = 1.0
    """Distributed noise: the encoded value of the clipping bound (secagg.encoding: the l2
    sensitivity of a client's encoded update, before rounding)."""
    over_selection: float = 0.0
    """Noise on the server or shared out: `round.over-selection`, each round samples at
    q (1 + o) and keeps the first arrivals (the module's text)."""
    buffer: int = 0
    """Noise on the server under FedBuff: `async.buffer`, the replies each model version's
    noisy sum takes (the module's text); 0: synchronous rounds."""

    @property
    def accounted_rate(self) -> float:
        """The rate at which a client's update can be in a round's release: q, or q' = min(1,
        q (1 + o)) with over-selection; 1 under FedBuff (no sample)."""
        if self.buffer:
            return 1.0
        return min(1.0, self.sample_rate * (1 + self.over_selection))

    @property
    def sensitivity(self) -> float:
        """A round's l2 sensitivity in units of the clipping bound: 1, or 2 with over-selection
        (one client in, another pushed out) and under FedBuff (one client's update replaced)."""
        return 2.0 if self.over_selection > 0 or self.buffer else 1.0

    @property
    def local(self) -> bool:
        """Each client's update noised on its own (the server sees every noised row)."""
        return self.at_client and not self.distributed

    @property
    def denominator(self) -> float:
        """m = q N: the expected number of clients a round, the fixed denominator of the
        server's noisy mean (local noise: the server averages the replies it gets); under
        FedBuff the buffer's K."""
        if self.buffer:
            return float(self.buffer)
        return self.sample_rate * self.clients

    def ledger_entry(self, rounds: int) -> tuple[float, float, int]:
        """(noise multiplier, sample rate, steps) of `rounds` Gaussian releases, as
        models.privacy accounts them (local noise: z / 2 at rate 1, see the module's text;
        distributed noise: the server's own, for a round with no sum; over-selection: z / 2 at
        q')."""
        if self.local:
            return (self.noise_multiplier / 2, 1.0, rounds)
        return (self.noise_multiplier / self.sensitivity, self.accounted_rate, rounds)

    def planned_release(self, rounds: int) -> tuple[float, float, float, float, int]:
        """Distributed noise: `rounds` releases of the whole round's noise, as models.privacy
        accounts them (sensitivities before the rounding, which the ledger adds)."""
        variance = (self.noise_multiplier * self.unit) ** 2
        l2 = self.sensitivity * self.unit
        return (variance, math.sqrt(2) * l2, l2, self.accounted_rate, rounds)

    def release(self, variance: float, l1: float, l2: float) -> tuple[float, float, float, float]:
        """Distributed noise: a round's release as models.privacy accounts it, from the sum's
        noise variance and one client's encoded update's sensitivities (twice them with
        over-selection)."""
        sens = self.sensitivity
        return (variance, sens * l1, sens * l2, self.accounted_rate)


def mechanism(settings: Mapping[str, Scalar]) -> Mechanism | None:
    """The run's client-level DP, its noise calibrated to `client-dp.target-epsilon` over
    `num-rounds` when asked; None when it is off. ValueError when no noise reaches the
    target."""
    dp = ClientDPSettings.of(settings)
    if not dp.enabled:
        return None
    run, secagg = RunSettings.of(settings), SecAggSettings.of(settings)
    at_client = dp.noise_at == "client"
    distributed = at_client and secagg.enabled
    local = at_client and not distributed
    buffer = 0 if at_client else AsyncSettings.of(settings).buffer
    q = 1.0 if local or buffer else run.fraction_train
    over = 0.0 if local else RoundSettings.of(settings).over_selection
    unit = float(1 << (secagg.bits - 1))
    mech = Mechanism(
        dp.noise_multiplier, dp.clip, dp.delta, q, run.training_clients, at_client, distributed,
        unit, over, buffer,
    )  # fmt: skip
    if dp.target_epsilon <= 0:
        return mech
    rate, sens = mech.accounted_rate, mech.sensitivity
    if distributed:
        from models.privacy import distributed_noise_for_epsilon  # lazy: opacus

        z = distributed_noise_for_epsilon(
            dp.target_epsilon, dp.delta, rate, run.num_rounds, sens * unit
        )
    else:
        from models.privacy import noise_for_epsilon  # lazy: opacus

        z = noise_for_epsilon(dp.target_epsilon, dp.delta, rate, run.num_rounds)
    # the calibrated z is per sensitivity: twice it with over-selection or FedBuff, and for
    # local noise (its accounting is z / 2 at rate 1, module text)
    return replace(mech, noise_multiplier=(2.0 if local else sens) * z)


def poisson_sampling(settings: Mapping[str, Scalar]) -> bool:
    """Whether rounds sample clients independently (Poisson sampling, as the privacy analysis
    of a noised sum assumes): client-level DP with the noise on the server, or distributed,
    in synchronous rounds (FedBuff has no rounds to sample for)."""
    mech = mechanism(settings)
    return mech is not None and not mech.local and not mech.buffer


def planned_epsilon(mech: Mechanism, rounds: int) -> float:
    """Epsilon after `rounds` rounds (local noise: of a client that trains in each;
    distributed: every client of each sum in it to the end, before the rounding's part)."""
    from models.privacy import distributed_epsilon, epsilon  # lazy: opacus

    if mech.distributed:
        return distributed_epsilon([mech.planned_release(rounds)], mech.delta)
    return epsilon([mech.ledger_entry(rounds)], mech.delta)
