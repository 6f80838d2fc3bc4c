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
everything else holds the point's rows at once.

Claimed sizes: only the mean reads the example counts clients report. With any pre-aggregation
step on, the mean's weights are capped at the round's median claim, so a client claiming 10^6
examples weighs no more than a typical one; every robust rule counts each client once.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from pollen.settings import AttackSettings, RobustSettings, RunSettings, Scalar
from robust import rules
from robust.attacks import attack_rows
from robust.flat import flatten, unflatten

Arrays = Mapping[str, np.ndarray]


class TooFewReplies(RuntimeError):
    """An aggregation point has fewer valid replies than the robust rule needs."""


class Combiner:
    """The run's combination rule, attackers included; stateless between rounds (its random
    draws, bucketing and the gaussian attack, come from the run's seed, the round and the
    point, so a resumed run draws the same)."""

    def __init__(self, settings: Mapping[str, Scalar]) -> None:
        self.robust = RobustSettings.of(settings)
        self.attack = AttackSettings.of(settings)
        self.attackers = frozenset(self.attack.ids())
        self.seed = RunSettings.of(settings).seed
        self._metrics: dict[str, float] = {}

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
        """The weighted mean with nothing around it: strategies may fold replies as they come."""
        return self.robust.rule == "mean" and not self.pre_aggregation and not self.injects

    def min_replies(self) -> int:
        """The fewest contributions a point needs: the rule's minimum for `robust.f`, counted
        after bucketing, and more than f for nearest-neighbour mixing."""
        r = self.robust
        return rules.clients_needed(r.rule, r.f, r.bucket, r.nnm)

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
        if not cids:
            raise TooFewReplies(f"round {server_round}, {point}: no contributions to combine")
        need = self.min_replies()
        if len(cids) < need:
            raise TooFewReplies(
                f"round {server_round}, {point}: {len(cids)} valid replies, but "
                f"robust.rule={self.robust.rule} with robust.f={self.robust.f} needs at least "
                f"{need} ({rules.breakdown_note(self.robust.rule)})"
            )
        template = reference if reference is not None else contributions[cids[0]]
        keys = list(template)
        base = flatten(reference, keys) if reference is not None else None
        x = np.stack([flatten(contributions[c], keys) for c in cids])
        if base is not None:
            x -= base
        if not attacked:
            x = self._attack(server_round, point, cids, x)
        x, w = self._pre_aggregate(server_round, point, x, cids, weights)
        r = self.robust
        agg = rules.aggregate(r.rule, x, r.f, weights=w, tau=r.tau, iterations=r.iterations)
        if base is not None:
            agg += base
        return unflatten(agg, template, keys)

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
        r = self.robust
        size = r.f if f is None else f
        return rules.aggregate(r.rule, x, size, tau=r.tau, iterations=r.iterations)

    def metrics(self) -> dict[str, float]:
        """What the points combined since the last call reported (attackers present, share of
        updates clipped, the clipping bound), then forgotten."""
        out, self._metrics = self._metrics, {}
        return out
