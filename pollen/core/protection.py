"""The settings of a run's protections and of the attacks that evaluate them: DP-SGD
(docs/privacy.md), client-level DP (docs/privacy.md#client-level-dp), secure aggregation
(docs/security.md#secure-aggregation), Byzantine-robust aggregation (docs/robustness.md) and
simulated attacks (docs/robustness.md#attacks). Every run has them, whatever its algorithm; its
registry entry says which it takes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pollen.core.settings import Scalar, SettingsError, SettingsGroup, setting
from robust.attacks import KINDS
from robust.rules import RULES


@dataclass(frozen=True)
class DPSettings(SettingsGroup):
    """Sample-level differential privacy of the supervised local training (DP-SGD with Opacus,
    docs/privacy.md), for the algorithms whose registry entry allows it. It is on when
    `noise-multiplier` or `target-epsilon` is above 0."""

    PREFIX: ClassVar[str] = "dp"

    noise_multiplier: float = setting(
        0.0,
        "DP-SGD: Gaussian noise std on each step's sum of clipped per-example gradients, in units "
        "of max-grad-norm (0 and target-epsilon 0: no DP-SGD)",
        minimum=0.0,
    )
    target_epsilon: float = setting(
        0.0,
        "DP-SGD: instead of noise-multiplier, the noise that brings each client to this epsilon "
        "after num-rounds rounds of local training (Opacus' get_noise_multiplier; 0: off)",
        minimum=0.0,
    )
    max_grad_norm: float = setting(
        1.0, "DP-SGD: per-example gradients are clipped to this l2 norm", minimum=1e-9
    )
    delta: float = setting(
        1e-5, "DP-SGD: delta of the reported (epsilon, delta)", minimum=1e-12, maximum=0.5
    )
    reproducible: bool = setting(
        False,
        "DP-SGD: draw the Poisson batches and the noise from the run's seed (reproducible runs, "
        "for experiments) instead of the operating system's entropy; no privacy against anyone "
        "who knows the seed",
    )

    @property
    def enabled(self) -> bool:
        """Whether local training runs as DP-SGD."""
        return self.noise_multiplier > 0 or self.target_epsilon > 0


CLIENT_DP_NOISE_AT = ("server", "client")
"""Where client-level DP's noise is added (`client-dp.noise-at`, docs/privacy.md)."""


@dataclass(frozen=True)
class ClientDPSettings(SettingsGroup):
    """Client-level differential privacy (DP-FedAvg with fixed or adaptive clipping,
    docs/privacy.md#client-level-dp), for the algorithms whose registry entry allows it. It
    is on when `noise-multiplier` or `target-epsilon` is above 0."""

    PREFIX: ClassVar[str] = "client-dp"

    noise_multiplier: float = setting(
        0.0,
        "client-level DP: Gaussian noise std on the sum of the clipped client updates, in units "
        "of client-dp.clip (0 and target-epsilon 0: off)",
        minimum=0.0,
    )
    target_epsilon: float = setting(
        0.0,
        "client-level DP: instead of noise-multiplier, the noise that brings the run to this "
        "epsilon after num-rounds rounds (0: off)",
        minimum=0.0,
    )
    max_epsilon: float = setting(
        0.0,
        "client-level DP: the privacy budget; a run whose planned rounds would spend more "
        "refuses to start (0: no budget)",
        minimum=0.0,
    )
    clip: float = setting(
        1.0,
        "client-level DP: each client's update (everything it sends in a round, as one vector) "
        "is clipped to this l2 norm; with target-quantile, the first round's bound",
        minimum=1e-9,
    )
    delta: float = setting(
        1e-5,
        "client-level DP: delta of the reported (epsilon, delta); choose it below 1 / the "
        "number of clients",
        minimum=1e-12,
        maximum=0.5,
    )
    target_quantile: float = setting(
        0.0,
        "client-level DP, adaptive clipping (Andrew et al. 2021): the share of updates the bound "
        "should leave unclipped, e.g. 0.5; 0: fixed clipping at client-dp.clip",
        minimum=0.0,
        maximum=1.0,
    )
    clip_lr: float = setting(
        0.2, "adaptive clipping: the bound's geometric learning rate eta_C", minimum=0.0
    )
    count_std: float = setting(
        0.0,
        "adaptive clipping: noise std on the count of unclipped updates; 0: the expected "
        "clients per round / 20",
        minimum=0.0,
    )
    noise_at: str = setting(
        "server",
        "where the noise is added: 'server' (the server clips each update and noises the sum) "
        "or 'client' (each client clips and noises its own update: the server never sees it "
        "un-noised)",
        choices=CLIENT_DP_NOISE_AT,
    )
    reproducible: bool = setting(
        False,
        "client-level DP: draw the noise and the Poisson sampling of clients from the run's "
        "seed (reproducible runs, for experiments); no privacy against anyone who knows the "
        "seed",
    )

    @property
    def enabled(self) -> bool:
        """Whether the run's aggregation is client-level differentially private."""
        return self.noise_multiplier > 0 or self.target_epsilon > 0

    @property
    def adaptive(self) -> bool:
        return self.target_quantile > 0


@dataclass(frozen=True)
class SecAggSettings(SettingsGroup):
    """Secure aggregation (SecAgg+, Bell et al., CCS 2020; docs/security.md#secure-aggregation):
    wherever the algorithm combines clients, the server learns only the (weighted) sum of what
    they send, never one client's contribution. Off by default."""

    PREFIX: ClassVar[str] = "secagg"

    enabled: bool = setting(
        False,
        "secure aggregation: clients mask what they send so that the server sees only sums "
        "(every point where the algorithm combines clients; docs/security.md)",
    )
    clip: float = setting(
        8.0,
        "secure aggregation: every value a client contributes (an update, or a gradient, "
        "correlation matrix) is clipped to [-clip, clip] before it is encoded as an integer; "
        "with client-level DP the range is client-dp.clip",
        minimum=1e-9,
    )
    bits: int = setting(
        22,
        "secure aggregation: bits of one encoded value, sign included (the quantization step is "
        "clip / 2^(bits - 1))",
        minimum=4,
        maximum=48,
    )
    modulus_bits: int = setting(
        0,
        "secure aggregation: sums are computed modulo 2^modulus-bits; 0: the fewest bits with "
        "which the sum of every client can never wrap (a smaller value is refused)",
        minimum=0,
        maximum=64,
    )
    degree: int = setting(
        0,
        "secure aggregation: neighbours each client masks with and shares its secrets among "
        "(SecAgg+'s k); 0: 2 ceil(log2 n) for a sum of n clients, every other client when fewer",
        minimum=0,
    )
    threshold: float = setting(
        0.5,
        "secure aggregation: a client's secrets are rebuilt from more than this share of its "
        "neighbourhood's shares (0.5: a majority); a sum completes while every neighbourhood "
        "keeps that many clients",
        minimum=0.5,
        maximum=1.0,
    )
    collusion: int = setting(
        0,
        "secure aggregation: clients of one sum that may collude with the server (c): the "
        "threshold t is raised until 2t > k + 1 + c, so that no split view gathers both of an "
        "honest client's secrets, and no sum, nor the difference of two sums of one input, "
        "holds fewer than c + 2 clients; docs/security.md#threat-model",
        minimum=0,
    )
    dropout: float = setting(
        0.0,
        "secure aggregation: the share of a sum's clients expected to drop out between the keys "
        "stage and the unmasking, each independently: k is then the fewest with which every "
        "neighbourhood keeps t clients but with probability 2^-20 (a secagg.degree set is "
        "checked against it instead); 0: k as secagg.degree says",
        minimum=0.0,
        maximum=0.49,
    )
    consistency: bool = setting(
        True,
        "secure aggregation: a consistency round before the unmasking: every client of the sum "
        "signs the list of its clients, and a client reveals shares only after t signatures "
        "on the same list from its neighbourhood (against a server that gives clients "
        "different lists); one more exchange a secure sum",
    )
    min_clients: int = setting(
        0,
        "secure aggregation: the fewest clients a secure sum may hold, and the fewest by which "
        "a later sum of the same input may differ from an earlier one; each client refuses to "
        "unmask otherwise; 0: collusion + 2",
        minimum=0,
    )

    def fewest(self) -> int:
        """m: the fewest clients of a sum, and of the difference of two sums of one input."""
        return max(self.min_clients, self.collusion + 2)

    def threshold_for(self, k: int) -> int:
        """t for neighbourhoods of k + 1 (secagg.graph.threshold with the collusion)."""
        from secagg import graph  # lazy: the secagg package imports its cryptography

        return graph.threshold(k, self.threshold, self.collusion)

    def graph_for(self, clients: int) -> tuple[int, int]:
        """(k, t) for a sum of `clients` clients (secagg.graph.parameters with these settings);
        ValueError when the settings cannot give them."""
        from secagg import graph  # lazy: the secagg package imports its cryptography

        return graph.parameters(clients, self.degree, self.threshold, self.collusion, self.dropout)


def resummed(
    settings: Mapping[str, Scalar], clients: Sequence[int], seed: Sequence[int]
) -> list[int]:
    """The clients of a later sum of an input already summed over `clients` (a restart):
    `clients` less m (SecAggSettings.fewest) drawn from `seed`, so that the two sums differ by
    a sum of m clients, never by the input of fewer (docs/security.md)."""
    from secagg import graph  # lazy: the secagg package imports its cryptography

    rng = np.random.default_rng([*seed, 0x5EC])
    return graph.fewer(clients, SecAggSettings.of(settings).fewest(), rng)


ROBUST_RULES = RULES
"""The names of `robust.rule` (docs/robustness.md; the functions are robust.rules')."""

ATTACKS = KINDS
"""The names of `attack.kind` (docs/robustness.md#attacks; the functions are robust.attacks')."""

NODE_ATTACKS = ("sign-flip", "gaussian", "model-replacement", "label-flip")
"""The attacks a node can run by itself (`pollen client --attack`, node config `attack`): those
that need no other client's update."""


@dataclass(frozen=True)
class RobustSettings(SettingsGroup):
    """Byzantine-robust aggregation at every point where an algorithm combines clients
    (docs/robustness.md). `mean` with nothing else on is the plain weighted mean, bitwise."""

    PREFIX: ClassVar[str] = "robust"

    rule: str = setting(
        "mean",
        "how the clients' updates are combined: the weighted mean, or a robust rule (median, "
        "trimmed-mean, krum, multi-krum, geomed, centered-clip); docs/robustness.md",
        choices=ROBUST_RULES,
    )
    f: int = setting(
        0,
        "Byzantine clients per round the rule is sized for (trimmed-mean trims f each side, "
        "krum/multi-krum score against n-f-2 neighbours, nnm mixes n-f neighbours)",
        minimum=0,
    )
    clip: float = setting(
        0.0,
        "pre-aggregation: each update's l2 norm (around the model the round started from) "
        "clipped to this bound; 0: off",
        minimum=0.0,
    )
    clip_quantile: float = setting(
        0.0,
        "pre-aggregation: adaptive clipping, the bound is this quantile of the round's update "
        "norms (0.5: the median norm); 0: off (robust.clip sets a fixed bound)",
        minimum=0.0,
        maximum=1.0,
    )
    nnm: bool = setting(
        False,
        "pre-aggregation: nearest-neighbour mixing, each update replaced by the mean of its "
        "n-f nearest updates (itself included) before the rule",
    )
    bucket: int = setting(
        0,
        "pre-aggregation: bucketing, the updates shuffled and averaged in buckets of this size "
        "before the rule; 0 or 1: off",
        minimum=0,
    )
    tau: float = setting(
        0.0,
        "centered-clip: the clipping radius around the running center; 0: the median distance "
        "of the updates to the round's starting model",
        minimum=0.0,
    )
    iterations: int = setting(
        3, "centered-clip: clipping iterations; geomed: at most 10x this many", minimum=1
    )


@dataclass(frozen=True)
class AttackSettings(SettingsGroup):
    """Simulated Byzantine clients, to evaluate the robust rules (docs/robustness.md#attacks).
    Off unless `attack.clients` names clients; a run under attack says so in its summary."""

    PREFIX: ClassVar[str] = "attack"

    clients: str = setting(
        "",
        "the attacking clients' ids, comma-separated, ranges allowed ('8,9' or '8-9'); "
        "empty: no attack",
    )
    kind: str = setting("sign-flip", "what the attacking clients do", choices=ATTACKS)
    scale: float = setting(
        10.0,
        "sign-flip: the update sent is -scale x the honest one; model-replacement: the boost "
        "(0: the number of clients combined)",
        minimum=0.0,
    )
    std: float = setting(1.0, "gaussian: std of the noise sent as the update", minimum=0.0)
    z: float = setting(
        0.0,
        "alie: the update sent is mean - z std of the honest ones; 0: the paper's z_max",
        minimum=0.0,
    )
    epsilon: float = setting(0.5, "ipm: the update sent is -epsilon x the honest mean", minimum=0.0)

    def ids(self) -> tuple[int, ...]:
        """The attacking clients' ids (validated by `parse_ids`)."""
        return parse_ids(self.clients)

    @property
    def active(self) -> bool:
        return bool(self.ids())


def parse_ids(text: str) -> tuple[int, ...]:
    """Client ids from '3,5-7' -> (3, 5, 6, 7); SettingsError names what is wrong."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise SettingsError(
                f"setting 'attack.clients': {part!r} is not a client id or a range like 8-9"
            ) from None
        if first < 0 or last < first:
            raise SettingsError(f"setting 'attack.clients': {part!r} is not a valid range")
        out.update(range(first, last + 1))
    return tuple(sorted(out))
