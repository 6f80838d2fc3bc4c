"""Where a strategy combines clients, robustly: the `robust.*` rule and pre-aggregation, and the
simulated attackers of `attack.*` (docs/robustness.md).

A strategy hands `Combiner.combine` the contributions of one aggregation point (a model, one
FedEM component, SCAFFOLD's two updates, FeDLRT's basis gradients, ...) with the arrays they
are updates of. The combiner flattens each client's arrays in one key order, subtracts the
reference, lets the simulated attackers replace their rows (they see every honest row and
the rule: the omniscient adversary the robustness literature evaluates against), clips,
mixes and buckets the rows as asked, applies the rule (robust.rules) and adds the result back
to the reference, each array in its own dtype.

With `robust.rule=mean` and nothing else on (`Combiner.plain`) strategies keep folding replies
one at a time into their weighted mean (memory of one model, results bitwise as before);
everything else holds the point's rows at once, except client-level DP's noisy sum, which
folds too (`Combiner.accumulator`).

Client-level DP (`client-dp.*`, docs/privacy.md#client-level-dp) is the last step of a point:
with the noise on the server, each row (attackers' included) is clipped to the round's bound
and the mean is DP-FedAvg's fixed-denominator noisy mean (robust.client_dp.NoisySum; the rule
is the mean, refused otherwise before start-up); with the noise on the clients, the rows
arrive noised and any rule combines them, unweighted. The adaptive bound is the combiner's
only state across rounds (`state`, `load_state`).

Secure aggregation (`secagg.*`, docs/security.md#secure-aggregation) leaves the server nothing
but each point's sum: the combiner says what the clients sum (`summed`: with client-level DP,
each client's update clipped by the client itself to the round's bound, and under distributed
DP its share of the noise; with robust.clip, clipped to that bound by the client) and turns the
unmasked sum into the point's result (`secured`): the weighted mean, DP-FedAvg's noisy mean over
the fixed denominator (the noise added here, or already in the sum). The robust rules, their
pre-aggregation and the simulated attackers need every client's row: the settings refuse them
with secure aggregation before anything starts.

Claimed sizes: only the mean reads the example counts clients report. With any pre-aggregation
step on, the mean's weights are capped at the round's median claim, so a client claiming 10^6
examples weighs no more than a typical one; every robust rule counts each client once.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from pollen.core.contracts import client_dp as dp_contract
from pollen.core.protection import (
    AttackSettings,
    ClientDPSettings,
    RobustSettings,
    SecAggSettings,
)
from pollen.core.settings import RunSettings, Scalar
from robust import client_dp, rules
from robust.attacks import attack_rows
from robust.flat import flatten, unflatten
from strategies.aggregate import RunningMean
from strategies.base import Secured, Summed

Arrays = Mapping[str, np.ndarray]


class Accumulator(Protocol):
    """A point's contributions folded one at a time (memory of one model)."""

    def add(self, arrays: Arrays, weight: float) -> None: ...

    def result(self) -> dict[str, np.ndarray]: ...


class _Mean:
    """The (weighted, or with `unit` unweighted) running mean of the replies."""

    def __init__(self, unit: bool) -> None:
        self.mean = RunningMean()
        self.unit = unit

    def add(self, arrays: Arrays, weight: float) -> None:
        self.mean.add(arrays, 1.0 if self.unit else weight)

    def result(self) -> dict[str, np.ndarray]:
        return self.mean.result()


class _NoisyMean:
    """Client-level DP's fixed-denominator noisy mean of one point, folded."""

    def __init__(self, combiner: Combiner, server_round: int, point: str, reference: Arrays):
        self.combiner, self.server_round, self.point = combiner, server_round, point
        self.sum = client_dp.NoisySum(reference, combiner.dp_bound())

    def add(self, arrays: Arrays, weight: float) -> None:
        self.sum.add(arrays)

    def result(self) -> dict[str, np.ndarray]:
        return self.combiner.release(self.server_round, self.point, self.sum)


class TooFewReplies(RuntimeError):
    """An aggregation point has fewer valid replies than the robust rule needs."""


class Combiner:
    """The run's combination rule, attackers and client-level DP included. Its random draws
    (bucketing, the gaussian attack; DP's noise with `client-dp.reproducible`) come from the
    run's seed, the round and the point, so a resumed run draws the same; its one state across
    rounds is client-level DP's adaptive clipping bound (`state`)."""

    def __init__(self, settings: Mapping[str, Scalar]) -> None:
        self.robust = RobustSettings.of(settings)
        self.attack = AttackSettings.of(settings)
        self.attackers = frozenset(self.attack.ids())
        self.seed = RunSettings.of(settings).seed
        self.min_valid = RunSettings.of(settings).min_replies
        self._metrics: dict[str, float] = {}
        self.dp_settings = ClientDPSettings.of(settings)
        self.dp = dp_contract.mechanism(settings)
        """Client-level DP, or None."""
        self.clip = self.dp.clip if self.dp is not None else 0.0
        """Client-level DP's clipping bound of the next round (adaptive clipping moves it)."""
        self.secure = SecAggSettings.of(settings).enabled
        """Secure aggregation: the server sees only sums (`summed`, `secured`)."""

    @property
    def server_dp(self) -> bool:
        """Client-level DP with the noise added here: every point's rows are clipped and its
        mean noised."""
        return self.dp is not None and not self.dp.at_client

    @property
    def denominator(self) -> float:
        """Client-level DP's fixed denominator m = q N."""
        assert self.dp is not None
        return self.dp.denominator

    @property
    def injects(self) -> bool:
        """Whether simulated attackers replace rows here (label-flip attacks in the clients)."""
        return bool(self.attackers) and self.attack.kind != "label-flip"

    @property
    def pre_aggregation(self) -> bool:
        r = self.robust
        return r.clip > 0 or r.clip_quantile > 0 or r.nnm or r.bucket > 1

    @property
    def plain(self) -> bool:
        """The weighted mean with nothing around it, as always: strategies may fold replies as
        they come."""
        return (
            self.robust.rule == "mean"
            and not self.pre_aggregation
            and not self.injects
            and self.dp is None
        )

    @property
    def folds(self) -> bool:
        """Whether a point's contributions fold one at a time (`accumulator`): the weighted
        mean when `plain`; under client-level DP with nothing but a fixed robust.clip around
        the mean, the noisy mean (noise on the server) or the unweighted mean of the noised
        replies (on the clients)."""
        if self.plain:
            return True
        if self.dp is None or self.injects or self.robust.rule != "mean":
            return False
        r = self.robust
        held = r.clip_quantile > 0 or r.nnm or r.bucket > 1
        return not (held or (r.clip > 0 and self.dp.at_client))

    def accumulator(self, server_round: int, point: str, reference: Arrays) -> Accumulator | None:
        """A fold for the point's contributions (models around `reference`) when the combiner
        `folds`, else None (the rule needs them all at once: `combine`)."""
        if not self.folds:
            return None
        if self.dp is None or self.dp.at_client:
            return _Mean(unit=self.dp is not None)
        return _NoisyMean(self, server_round, point, reference)

    def summed(
        self,
        records: Mapping[str, Arrays],
        around: Mapping[str, str] | None = None,
        weighted: bool = False,
        clip: float = 0.0,
    ) -> Summed:
        """What the clients of a secure phase sum at a point: `records` of their replies (minus
        the instruction's records `around` names), weighted by their example counts when
        `weighted`, in the range [-clip, clip] (0: the run's). Under client-level DP every
        client counts once, clips its update to the round's bound (the range of its encoding)
        and, noise on the clients, adds its share of the noise; with robust.clip the client
        clips its update to that bound."""
        if self.dp is not None:
            bound = self.dp_bound()
            noise = self.dp.noise_multiplier * bound if self.dp.at_client else 0.0
            return Summed(records, dict(around or {}), False, bound, bound, noise)
        l2 = self.robust.clip
        return Summed(records, dict(around or {}), weighted, clip, l2)

    def secured(
        self,
        server_round: int,
        point: str,
        secured: Secured,
        references: Mapping[str, Arrays],
    ) -> dict[str, dict[str, np.ndarray]]:
        """A point's result from its unmasked sum of updates around `references` (record ->
        arrays): for each record, its reference plus the weighted mean of the updates; under
        client-level DP, plus the mean over the fixed denominator with the noise (added here
        with the noise on the server; with it on the clients, already in the sum), every
        record of a client one update. Each array in its reference's dtype."""
        if self.dp is None:
            means = {}
            for record, reference in references.items():
                mean = secured.mean(record)
                means[record] = {  # (an array not summed, an integer one, keeps its reference)
                    k: _in_dtype(np.asarray(v, np.float64) + mean[k], v) if k in mean else v
                    for k, v in reference.items()
                }
            return means
        joint = {f"{r}/{k}": v for r, arrays in references.items() for k, v in arrays.items()}
        total = client_dp.NoisySum(joint, self.dp_bound())
        if secured.replies:
            sums = {f"{r}/{k}": v for r, arrays in secured.sums.items() for k, v in arrays.items()}
            summed = {k: sums.get(k, np.zeros(np.shape(v))) for k, v in joint.items()}
            total.add_sum(flatten(summed, list(joint)), len(secured.replies))
        if secured.release is not None:  # distributed DP: the noise came with the sum
            out = total.result(self.denominator, 0.0, np.random.default_rng())
            self._metrics[dp_contract.CLIP] = total.clip
            self._metrics[dp_contract.NOISE_STD] = secured.noise_std / self.denominator
        else:  # the noise on the server, or a round with no sum: the server noises it
            out = self.release(server_round, point, total)
        return {
            record: {k: out[f"{record}/{k}"] for k in arrays}
            for record, arrays in references.items()
        }

    def rule_needs(self) -> int:
        """The fewest contributions the rule needs for `robust.f`: its minimum counted after
        bucketing, and more than f for nearest-neighbour mixing."""
        r = self.robust
        return rules.clients_needed(r.rule, r.f, r.bucket, r.nnm)

    def min_replies(self) -> int:
        """The fewest valid replies a phase needs: `min-replies`, and what the rule needs
        (client-level DP's noisy sum needs no more: a round whose Poisson sample is empty
        releases noise alone)."""
        if self.server_dp:
            return self.min_valid
        return max(self.min_valid, self.rule_needs())

    def dp_bound(self) -> float:
        """This round's clipping bound under client-level DP: the adaptive (or fixed) bound,
        or robust.clip where that is smaller."""
        r = self.robust.clip
        return min(self.clip, r) if r > 0 else self.clip

    def release(
        self, server_round: int, point: str, total: client_dp.NoisySum
    ) -> dict[str, np.ndarray]:
        """The noisy mean of the clipped contributions in `total`, and the next round's bound
        under adaptive clipping (Andrew et al. 2021, Alg. 1); the round's metrics record the
        bound, the noise and the released share of unclipped updates."""
        assert self.dp is not None
        s = self.dp_settings
        rng = self._noise_rng(server_round, point)
        m = self.denominator
        z = self.dp.noise_multiplier
        if s.adaptive:
            sigma_b = client_dp.count_std(m, s.count_std)
            z = client_dp.update_noise_multiplier(z, sigma_b)
        out = total.result(m, z, rng)
        self._metrics[dp_contract.CLIP] = total.clip
        self._metrics[dp_contract.NOISE_STD] = client_dp.noise_std(z, total.clip, m)
        if s.adaptive:
            share = client_dp.noisy_count(total.unclipped, m, sigma_b, rng)
            self._metrics[dp_contract.UNCLIPPED] = share
            self.clip = client_dp.next_clip(self.clip, share, s.target_quantile, s.clip_lr)
        return out

    def _noise_rng(self, server_round: int, point: str) -> np.random.Generator:
        """The noise's randomness: the operating system's entropy, or with
        `client-dp.reproducible` the run's seed."""
        if self.dp_settings.reproducible:
            return self._rng(server_round, point, "client-dp")
        return np.random.default_rng()

    def state(self) -> dict[str, Any]:
        """The adaptive clipping bound, for the checkpoint (nothing without adaptive DP)."""
        if self.dp is None or not self.dp_settings.adaptive:
            return {}
        return {dp_contract.STATE: {"clip": self.clip}}

    def load_state(self, meta: Mapping[str, Any]) -> None:
        saved = meta.get(dp_contract.STATE)
        if isinstance(saved, Mapping) and self.dp is not None:
            self.clip = float(saved["clip"])

    def _rng(self, server_round: int, point: str, purpose: str) -> np.random.Generator:
        tag = zlib.crc32(f"{point}/{purpose}".encode())
        return np.random.default_rng([self.seed, server_round, tag])

    def combine(
        self,
        server_round: int,
        point: str,
        contributions: Mapping[int, Arrays],
        reference: Arrays | None = None,
        weights: Mapping[int, float] | None = None,
        *,
        attacked: bool = False,
    ) -> dict[str, np.ndarray]:
        """The contributions (client id -> arrays) combined into one set of arrays: reference +
        rule(contribution - reference) (reference None: 0, the contributions are updates
        themselves). `weights` (claimed example counts) are read by the mean only. With
        `attacked`, the contributions already went through `attack_replies`. Raises
        TooFewReplies when the rule cannot tolerate robust.f with this many contributions."""
        cids = sorted(contributions)
        if self.server_dp and reference is None:
            raise ValueError(f"{point}: client-level DP clips updates around a reference")
        if not cids and not self.server_dp:
            raise TooFewReplies(f"round {server_round}, {point}: no contributions to combine")
        need = self.rule_needs()
        if len(cids) < need and not self.server_dp:
            raise TooFewReplies(
                f"round {server_round}, {point}: {len(cids)} valid replies, but "
                f"robust.rule={self.robust.rule} with robust.f={self.robust.f} needs at least "
                f"{need} ({rules.breakdown_note(self.robust.rule)})"
            )
        template = reference if reference is not None else contributions[cids[0]]
        keys = list(template)
        base = flatten(reference, keys) if reference is not None else None
        x = np.stack([flatten(contributions[c], keys) for c in cids]) if cids else None
        if x is not None and base is not None:
            x -= base
        if x is not None and not attacked:
            x = self._attack(server_round, point, cids, x)
        if self.server_dp:
            assert reference is not None
            return self._noisy_combination(server_round, point, x, reference)
        assert x is not None
        if self.dp is not None:
            weights = None  # noised rows count once each
        x, w = self._pre_aggregate(server_round, point, x, cids, weights)
        r = self.robust
        agg = rules.aggregate(r.rule, x, r.f, weights=w, tau=r.tau, iterations=r.iterations)
        if base is not None:
            agg += base
        return unflatten(agg, template, keys)

    def _noisy_combination(
        self,
        server_round: int,
        point: str,
        x: np.ndarray | None,
        reference: Arrays,
    ) -> dict[str, np.ndarray]:
        """Client-level DP's noisy mean of the rows (updates around `reference`), each clipped:
        what `_NoisyMean` folds, for a point whose rows were held (simulated attackers)."""
        total = client_dp.NoisySum(reference, self.dp_bound())
        for row in x if x is not None else ():
            total.add_update(row)
        return self.release(server_round, point, total)

    def attack_replies(
        self,
        server_round: int,
        point: str,
        contributions: Mapping[int, Arrays],
        references: Mapping[int, Arrays],
    ) -> dict[int, dict[str, np.ndarray]]:
        """The contributions with the simulated attackers' replaced, each client's update taken
        against its own reference (Clustered FL's cluster model, D-FedEM's gossip start): for
        algorithms that use the replies themselves, not only their combination."""
        cids = sorted(contributions)
        if not self.injects or not self.attackers.intersection(cids):
            return {c: dict(contributions[c]) for c in cids}
        keys = list(contributions[cids[0]])
        starts = np.stack([flatten(references[c], keys) for c in cids])
        x = np.stack([flatten(contributions[c], keys) for c in cids]) - starts
        x = self._attack(server_round, point, cids, x) + starts
        return {c: unflatten(x[i], contributions[c], keys) for i, c in enumerate(cids)}

    def _attack(self, server_round: int, point: str, cids: list[int], x: np.ndarray) -> np.ndarray:
        bad = [i for i, c in enumerate(cids) if c in self.attackers]
        if not self.injects or not bad:
            return x
        good = [i for i, c in enumerate(cids) if c not in self.attackers]
        a = self.attack
        x[bad] = attack_rows(
            a.kind,
            x[good],
            x[bad],
            rule=self.aggregate_rows,
            f=self.robust.f,
            rng=self._rng(server_round, point, "attack"),
            scale=a.scale,
            std=a.std,
            z=a.z,
            epsilon=a.epsilon,
        )
        self._metrics["attackers"] = max(self._metrics.get("attackers", 0.0), float(len(bad)))
        return x

    def _pre_aggregate(
        self,
        server_round: int,
        point: str,
        x: np.ndarray,
        cids: Sequence[int],
        weights: Mapping[int, float] | None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Clipping, mixing and bucketing as asked; the mean's weights (capped at the median
        claim when any of them is on; None for the robust rules and after bucketing)."""
        w = None
        if self.robust.rule == "mean" and weights is not None:
            w = np.array([float(weights[c]) for c in cids])
            if self.pre_aggregation:
                w = np.minimum(w, np.median(w))
        rng = self._rng(server_round, point, "bucketing")
        x, bound, clipped = self._prepare(x, rng)
        if bound > 0:
            m = self._metrics
            m["robust-clipped"] = max(m.get("robust-clipped", 0.0), clipped)
            m["robust-clip-bound"] = max(m.get("robust-clip-bound", 0.0), bound)
        return x, (None if self.robust.bucket > 1 else w)

    def _prepare(self, x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, float, float]:
        """The pre-aggregation steps on the rows: (rows, clipping bound or 0, share clipped)."""
        r = self.robust
        bound = r.clip
        if r.clip_quantile > 0:
            bound = rules.norm_quantile(x, r.clip_quantile)
            bound = min(bound, r.clip) if r.clip > 0 else bound
        clipped = 0.0
        if bound > 0:
            clipped = float((np.linalg.norm(x, axis=1) > bound).mean())
            x = rules.clip_rows(x, bound)
        if r.nnm:
            x = rules.nearest_neighbour_mixing(x, r.f)
        if r.bucket > 1:
            x = rules.bucketing(x, r.bucket, rng)
        return x, bound, clipped

    def aggregate_rows(self, x: np.ndarray, f: int | None = None) -> np.ndarray:
        """What the server does to a point's rows (updates), unweighted: pre-aggregation with
        a fixed shuffle, then the rule sized for f (default robust.f). Adaptive attackers
        optimise against it; Clustered FL's split criterion measures the cluster's update by
        it."""
        x, _, _ = self._prepare(np.array(x, dtype=np.float64), np.random.default_rng(0))
        if self.server_dp:
            x = rules.clip_rows(x, self.dp_bound())
        r = self.robust
        size = r.f if f is None else f
        return rules.aggregate(r.rule, x, size, tau=r.tau, iterations=r.iterations)

    def metrics(self) -> dict[str, float]:
        """What the points combined since the last call reported (attackers present, share of
        updates clipped, the clipping bound), then forgotten."""
        out, self._metrics = self._metrics, {}
        return out


def _in_dtype(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """`value` in `like`'s dtype (integers rounded)."""
    dtype = np.asarray(like).dtype
    return (value if dtype.kind in "fc" else np.rint(value)).astype(dtype)
