"""FedSC server (Jing et al., ICML 2024, Algorithm 1): a round has two phases.

1. `query.correlation` (sharing rounds only): clients release DP-CalR correlation matrices of
   the current model. The first sharing round asks every client (unsampled ones too), later
   ones the sampled clients; the server keeps the latest copy of every client's matrix, so
   unsampled clients count with a stale one.
2. `train`: each sampled client gets the model and its own Rbar_{-j} = sum_{k != j} q_k R~_k /
   sum_{k != j} q_k (never its own matrix), trains with alpha of the schedule, and the server
   averages the weights (by training examples, or uniformly).

Privacy: the server mirrors each client's ledger (releases T_j; epsilon by Opacus' RDP
accountant at sensitivity sqrt(2) mu / |D_j|, see models.dp_correlation) and reports it every
round. With `fedsc.epsilon-budget` set, a client whose next release would exceed the budget is no
longer asked; its last matrix stays in use. The ledger counts every request (a conservative
upper bound when a reply is lost); each client also keeps and enforces its own. Model weights
are not protected.

Byzantine robustness (`robust.*`, docs/robustness.md; strategies.robust.Combiner). With the
plain mean the round is bitwise today's. With a robust rule:
  train phase   the model is combined like FedAvg's: the rule over the updates w_j - w around
                the model the round started from (Alg. 1, the server's model average).
  Rbar_{-j}     the rule over the other clients' stored matrices R~_k, k != j (reference 0:
                the matrices themselves; `others` is its weighted-mean form, Alg. 1 line 20),
                then projected back to symmetric positive semidefinite (`psd_projection`:
                eigenvalues clipped at 0; a coordinate-wise median of PSD matrices need not
                be PSD) and scaled into the box every stored matrix lies in (`within_bound`,
                |entries| <= mu + 10 sigma, what `validate_correlation` accepts). The
                simulated attackers (`attack.clients`) replace the matrices they release when
                they release them (Combiner.attack_replies, over that round's releases), and
                each injected matrix is symmetrised and clipped to that box before it is
                stored (`_attacked`): exactly what a real attacker could get past
                `validate_correlation`; it then counts, stale, like any stored matrix.

Secure aggregation (`secagg.*`, docs/security.md#secure-aggregation): the model's update is
summed like FedAvg's, and a sharing round's matrices are summed too, each weighted by q_j; the
server keeps only that sum (`SharedSum`: its weight and each client's q_j in it), and each client
computes its Rbar_{-j} from it less its own release (models.spectral.others_from_sum). The sum
holds that round's releases: a client that did not release counts with no matrix.

`fedavg-sc` is the same server with alpha = 1 and nothing shared (FedAvg + spectral contrastive,
FedAvgSC); `fedavg-simclr` runs it with clients that train SimCLR's loss instead, `fedavg-byol`
(FedAvgBYOL) with clients that train BYOL's, whose predictor is part of the averaged model.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import RecordDict

from federated_data import load_client_data, load_server_test_data
from models.dp_correlation import closed_form_epsilon, release_epsilon, sensitivity
from models.spectral import alpha_at, others, psd_projection, within_bound
from models.ssl_eval import embed, knn_accuracy, linear_probe
from models.ssl_nets import build_contrastive_net
from models.weights import get_weights, set_weights
from pollen.core import protocol
from pollen.core.contracts.fedsc import (
    ALPHA,
    CLIPPED_FRACTION,
    CORRELATION,
    CORRELATION_PHASE,
    OTHERS,
    OTHERS_SUM,
    OWN,
    SHARED_ROUND,
    SUM,
    WEIGHT,
    FedSCSettings,
    R,
)
from pollen.core.dataspec import data_spec, model_input
from pollen.core.paths import cache_dir
from pollen.core.protection import SecAggSettings
from pollen.core.settings import RunSettings
from secagg import graph
from strategies.aggregate import (
    aggregate_metrics,
    expect_arrays,
    final_evaluation,
    num_examples,
)
from strategies.base import ClientInfo, Federation, InvalidReply, Secured
from strategies.global_model import GlobalModelStrategy
from strategies.privacy import SharedNoiseLedger
from strategies.schedule import learning_rate

log = logging.getLogger("flwr.pollen")
_STORE = "fedsc-correlation/"  # checkpoint keys of the stored matrices
_SHARED = "fedsc-shared-sum"  # checkpoint key of the secure sum of the matrices


def shares(fedsc: FedSCSettings, server_round: int) -> bool:
    """Whether correlation matrices are shared in a round ('after': rounds t > share-after;
    'after-even': those of even t; the paper's DP schedules are t > 100, t > 150, t > 100 even)."""
    mode = fedsc.share
    if mode == "never":
        return False
    late = server_round > fedsc.share_after
    return late and (mode != "after-even" or server_round % 2 == 0)


class FedSC(GlobalModelStrategy):
    share_correlations: ClassVar[bool] = True
    predictor: ClassVar[bool] = False
    """The model has BYOL's predictor (FedAvgBYOL)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.fedsc = FedSCSettings.of(settings)
        self.latest: dict[int, np.ndarray] = {}
        self.releases: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.shared: SharedSum | None = None
        """Under secure aggregation, the newest sum of released matrices (the server never
        holds one client's)."""
        self.shared_noise = SharedNoiseLedger(self.fedsc.delta)
        """`fedsc.noise-at=sum`: each client's releases with the noise the sums carried."""
        self._evaluator = RepresentationEvaluator(settings, self.predictor)

    @property
    def evaluator(self) -> RepresentationEvaluator:
        """The centralised evaluation of this run's encoder (its network, data and probe)."""
        return self._evaluator

    @property
    def dim(self) -> int:
        return self.fedsc.dim

    def initialize(self, seed: int) -> None:
        torch.manual_seed(seed)
        net = self._evaluator.new_net()
        # through the message codec once: it stores 0-d tensors (BatchNorm's batch counters)
        # with shape (1,), the shape every reply will have
        self.weights = protocol.from_record(protocol.to_record(get_weights(net)))

    # ---- weights of clients: q_j over every training client ---------------------------------
    def _q(self, pool: list[ClientInfo]) -> dict[int, float]:
        if self.fedsc.weighting == "uniform":
            return {c.cid: 1.0 for c in pool}
        return {c.cid: float(max(c.num_train, 1)) for c in pool}

    def epsilon(self, cid: int, releases: int | None = None) -> float:
        if self.fedsc.noise_at == "sum":
            return self.shared_noise.epsilon(cid)
        count = self.releases.get(cid, 0) if releases is None else releases
        f = self.fedsc
        return release_epsilon(
            count,
            self.sizes.get(cid, 1),
            mu=f.mu,
            noise_std=f.noise_std,
            delta=f.delta,
            convention=f.sensitivity,
        )

    def _within_budget(self, cid: int, asked: int) -> bool:
        """Whether client `cid`'s next release stays within `fedsc.epsilon-budget` (noise
        shared out: in a sum of `asked` clients that keeps only the protocol's fewest)."""
        budget = self.fedsc.epsilon_budget
        if budget <= 0:
            return True
        if self.fedsc.noise_at == "sum":
            return self.shared_noise.epsilon(cid, self._fewest_noise(cid, asked)) <= budget
        return self.epsilon(cid, self.releases.get(cid, 0) + 1) <= budget

    def _release(
        self, cid: int, others: float, a: float
    ) -> tuple[float, float, float, float, int]:
        """One shared-noise release of client `cid` weighted a, the others' noise of variance
        `others` (encoded units: the range mu + 10 sigma of `_share_securely` at
        secagg.bits): the sensitivity of its term a W_j, plus the rounding (H values)."""
        f, bits = self.fedsc, SecAggSettings.of(self.settings).bits
        scale = 2.0 ** (bits - 1) / (f.mu + 10 * f.noise_std)
        w = sensitivity(f.mu, max(self.sizes.get(cid, 1), 1), f.sensitivity)
        l2 = a * w * scale + self.dim
        return (others, self.dim * l2, l2, 1.0, 1)

    def _fewest_noise(self, cid: int, asked: int) -> tuple[float, float, float, float, int]:
        """The release of client `cid` in the smallest sum of `asked` clients the protocol
        unmasks (the threshold t of its graph), at weight 1: the others' noise is t - 1 shares."""
        s = SecAggSettings.of(self.settings)
        try:
            k = s.graph_for(asked)[0]  # the server's k, secagg.dropout's included
        except ValueError:  # no graph holds this sum: it fails at the server, nothing released
            k = graph.degree(asked, s.degree)
        t = graph.threshold(k, s.threshold)
        f = self.fedsc
        per = (f.noise_std * 2.0 ** (s.bits - 1) / (f.mu + 10 * f.noise_std)) ** 2 / asked
        return self._release(cid, per * (max(t, 2) - 1), 1.0)

    def _charge_shared(self, secured: Secured) -> None:
        """The sum's release of each client in it: the other clients' shares of the noise."""
        if secured.release is None:
            return
        count = len(secured.clients)
        per = secured.release[0] / count
        for cid in secured.clients:
            a = secured.weights[cid] / secured.weight_scale
            self.shared_noise.charge(cid, *self._release(cid, per * (count - 1), a)[:3])

    # ---- a round -----------------------------------------------------------------------------
    def run_round(self, fed: Federation) -> dict[str, float]:
        t = fed.server_round
        pool = fed.available()
        self.sizes.update({c.cid: c.num_train for c in pool})
        clients = fed.sample(pool)
        q = self._q(pool)
        out: dict[str, float] = {}
        if self.share_correlations and shares(self.fedsc, t):
            first = not (self.shared if self.combiner.secure else self.latest)
            out.update(self._share(fed, pool if first else clients))
        rounds = self.run.num_rounds
        lr = learning_rate(self.settings, t)
        payloads: dict[int, RecordDict] = {}
        model = protocol.to_record(self.weights)  # encoded once, the same for every client
        for c in clients:
            alpha = 1.0
            if self.share_correlations:
                alpha = alpha_at(
                    self.fedsc.alpha_schedule,
                    t,
                    rounds,
                    self.fedsc.alpha_min,
                    q[c.cid] / sum(q.values()),
                )
            extra: dict[str, dict[str, np.ndarray]] = {}
            if alpha < 1 and self.combiner.secure:
                extra = self._others_sum(c.cid)
            elif alpha < 1:
                rbar = self._others(t, q, c.cid)
                extra = {OTHERS: {R: rbar.astype(np.float32)}} if rbar is not None else {}
            config = {"lr": lr, ALPHA: alpha}
            payloads[c.cid] = protocol.instruction(t, "train", config, arrays=model, **extra)
        uniform = self.fedsc.weighting == "uniform"
        self.privacy.charge(clients)  # client-level DP (the baselines), when the run has it
        replies = self.train_model(
            fed, payloads, lambda r: 1 if uniform else num_examples(r), weighted=not uniform
        )
        out.update(aggregate_metrics(replies))
        out.update(self._ledger())
        out.update(self.privacy.metrics())
        out.update(self.combiner.metrics())
        return out

    def _others(self, server_round: int, q: Mapping[int, float], cid: int) -> np.ndarray | None:
        """Client `cid`'s Rbar_{-j}: the q-weighted mean of the other clients' latest matrices
        (`others`, the plain mean), or the robust rule over them, projected back to PSD and
        into the accepted box (module docstring); None when no other client has shared."""
        if self.combiner.plain:
            return others(self.latest, q, cid)
        rest = {k: {R: r} for k, r in sorted(self.latest.items()) if k != cid}
        if not rest:
            return None
        weights = {k: q[k] for k in rest}
        combined = self.combiner.combine(
            server_round, f"correlations-{cid}", rest, None, weights, attacked=True
        )
        bound = self.fedsc.mu + 10 * self.fedsc.noise_std
        return within_bound(psd_projection(combined[R]), bound)

    def _others_sum(self, cid: int) -> dict[str, dict[str, np.ndarray]]:
        """Under secure aggregation: the sum of the newest released matrices, its weight and the
        client's own weight in it, from which it computes Rbar_{-j} itself
        (models.spectral.others_from_sum); nothing when no other client is in the sum."""
        shared = self.shared
        if shared is None:
            return {}
        own = shared.weights.get(cid, 0.0)
        if shared.weight - own <= 1e-9 * max(shared.weight, 1.0):
            return {}
        return {
            OTHERS_SUM: {
                SUM: shared.total,
                WEIGHT: np.array([shared.weight]),
                OWN: np.array([own]),
                SHARED_ROUND: np.array([shared.server_round]),
            }
        }

    def _share_securely(
        self, fed: Federation, payloads: Mapping[int, RecordDict]
    ) -> tuple[dict[str, float], dict[int, RecordDict]]:
        """The round's releases summed securely (each client's matrix weighted by q_j): the
        server keeps their sum, its weight and each client's weight in it."""
        bound = self.fedsc.mu + 10 * self.fedsc.noise_std
        summed = self.combiner.summed(
            {CORRELATION: {R: np.zeros((self.dim, self.dim), np.float32)}},
            weighted=self.fedsc.weighting != "uniform",
            clip=bound,
        )
        if self.fedsc.noise_at == "sum":  # the clients' shares of DP-CalR's noise, as integers
            summed = dataclasses.replace(summed, noise_std=self.fedsc.noise_std)
        secured = fed.secure_exchange(CORRELATION_PHASE, payloads, summed)
        self._charge_shared(secured)
        total = secured.sums[CORRELATION][R]
        self.shared = SharedSum(
            total=(total + total.T) / 2,  # (the noise is drawn per entry: post-processing)
            weight=secured.weight,
            weights=dict(secured.weights),
            server_round=fed.server_round,
        )
        return {"shared": float(len(secured.replies))}, secured.replies

    def _share(self, fed: Federation, asked: list[ClientInfo]) -> dict[str, float]:
        asked = [c for c in asked if self._within_budget(c.cid, len(asked))]
        if not asked:
            return {"shared": 0.0}
        model = protocol.to_record(self.weights)
        payloads = protocol.to_each(
            (c.cid for c in asked),
            protocol.instruction(fed.server_round, CORRELATION_PHASE, arrays=model),
        )
        for c in asked:  # counted when requested: a lost reply may still have been released
            self.releases[c.cid] = self.releases.get(c.cid, 0) + 1
        if self.combiner.secure:
            out, replies = self._share_securely(fed, payloads)
            clipped = aggregate_metrics(replies).get(CLIPPED_FRACTION)
            return out | ({} if clipped is None else {CLIPPED_FRACTION: clipped})
        replies = fed.exchange(CORRELATION_PHASE, payloads, self.validate_correlation)
        fresh = {
            cid: protocol.arrays_of(content, CORRELATION)[R].astype(np.float64)
            for cid, content in replies.items()
        }
        if self.combiner.injects:
            fresh = self._attacked(fed.server_round, fresh)
        self.latest.update(fresh)
        out = {"shared": float(len(replies))}
        clipped = aggregate_metrics(replies).get(CLIPPED_FRACTION)
        if clipped is not None:
            out[CLIPPED_FRACTION] = clipped
        return out

    def _attacked(
        self, server_round: int, fresh: Mapping[int, np.ndarray]
    ) -> dict[int, np.ndarray]:
        """This round's released matrices with the simulated attackers' replaced
        (Combiner.attack_replies, reference 0: the attack acts on the matrices themselves),
        each injected one then made one that `validate_correlation` accepts: symmetrised and
        its entries clipped to +-(mu + 10 sigma). They are stored as a real attacker's would
        be, and count, stale, in later rounds."""
        bound = self.fedsc.mu + 10 * self.fedsc.noise_std
        rows = {cid: {"r": r} for cid, r in fresh.items()}
        zeros = {cid: {"r": np.zeros_like(r)} for cid, r in fresh.items()}
        attacked = self.combiner.attack_replies(server_round, "correlations", rows, zeros)
        out = dict(fresh)
        for cid in self.combiner.attackers.intersection(fresh):
            r = attacked[cid]["r"]
            out[cid] = np.clip(0.5 * (r + r.T), -bound, bound)
        return out

    def _ledger(self) -> dict[str, float]:
        """Privacy of the correlation releases so far (max over clients)."""
        if not self.releases:
            return {"epsilon": 0.0, "releases-max": 0.0}
        f = self.fedsc
        if f.noise_at == "sum":
            eps = [self.epsilon(c) for c in self.releases]
            return {"epsilon": max(eps), "releases-max": float(max(self.releases.values()))}
        closed = [
            closed_form_epsilon(
                n,
                f.noise_std,
                sensitivity(f.mu, max(self.sizes.get(c, 1), 1), f.sensitivity),
                f.delta,
            )
            for c, n in self.releases.items()
        ]
        eps = [self.epsilon(c) for c in self.releases]
        # the JSON metrics file takes no infinity: sigma = 0 reports -1 (no guarantee)
        return {
            "epsilon": max(eps) if math.isfinite(max(eps)) else -1.0,
            "epsilon-closed-form": max(closed) if math.isfinite(max(closed)) else -1.0,
            "releases-max": float(max(self.releases.values())),
        }

    def privacy_guarantees(self) -> dict[str, dict[str, Any]]:
        """DP-CalR's guarantee for the correlation matrices released so far (docs/privacy.md)."""
        if not self.share_correlations:
            return {}
        return {
            "correlations": {
                "epsilon": self._ledger()["epsilon"],
                "delta": self.fedsc.delta,
                "mechanism": "DP-CalR"
                + (", its noise shared out in the secure sum (Skellam)"
                   if self.fedsc.noise_at == "sum" else ""),
                "protects": "one image of a client, in the correlation matrices it releases "
                "(the model weights travel in the clear)",
            }
        }

    def validate_correlation(self, _cid: int, content: RecordDict) -> None:
        """An H x H float32 matrix, symmetric, entries within what clipping allows: a clipped
        correlation has |R_ab| <= mu, and the noise adds at most a few sigma."""
        r = expect_arrays(content, CORRELATION, {"r": np.zeros((self.dim, self.dim), np.float32)})[
            "r"
        ]
        if not np.isfinite(r).all():
            raise InvalidReply("correlation matrix has NaN or Inf")
        scale = max(1.0, float(np.abs(r).max()))
        if np.abs(r - r.T).max() > 1e-5 * scale:
            raise InvalidReply("correlation matrix is not symmetric")
        bound = self.fedsc.mu + 10 * self.fedsc.noise_std
        if np.abs(r).max() > bound * (1 + 1e-5):
            raise InvalidReply(f"correlation entry {np.abs(r).max():.4g} exceeds mu + 10 sigma")

    # ---- evaluation --------------------------------------------------------------------------
    def server_evaluate(self) -> dict[str, float]:
        return self._evaluator.knn(self.weights)

    def finalize(self, fed: Federation) -> dict[str, float]:
        model = protocol.to_record(self.weights)
        out = final_evaluation(
            fed,
            lambda c, new: protocol.instruction(
                fed.server_round, "evaluate", {protocol.UNSEEN: new}, arrays=model
            ),
        )
        out.update(self._evaluator.probe(self.weights))
        out.update(self._ledger())
        return out

    # ---- checkpoint --------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = dict(self.weights)
        arrays.update({f"{_STORE}{cid}": r for cid, r in self.latest.items()})
        meta = {
            "releases": {str(k): v for k, v in self.releases.items()},
            "sizes": {str(k): v for k, v in self.sizes.items()},
        }
        if self.shared is not None:
            arrays[_SHARED] = self.shared.total
            meta[_SHARED] = self.shared.meta()
        if self.shared_noise.entries:
            meta["shared-noise"] = self.shared_noise.state()
        return arrays, meta | self.privacy.state() | self.combiner.state()

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        self.weights = {
            k: v for k, v in arrays.items() if not k.startswith(_STORE) and k != _SHARED
        }
        shared = meta.get(_SHARED)
        self.shared = None if shared is None else SharedSum.load(arrays[_SHARED], shared)
        self.shared_noise.load_state(meta.get("shared-noise", {}))
        self.latest = {
            int(k.removeprefix(_STORE)): np.asarray(v, dtype=np.float64)
            for k, v in arrays.items()
            if k.startswith(_STORE)
        }
        self.releases = {int(k): int(v) for k, v in meta.get("releases", {}).items()}
        self.sizes = {int(k): int(v) for k, v in meta.get("sizes", {}).items()}
        self.privacy.load_state(meta)
        self.combiner.load_state(meta)


@dataclass(frozen=True)
class SharedSum:
    """The secure sum of a sharing round's matrices: sum_k q_k R~_k, sum_k q_k, each client's
    q_k in it (0: not in it), the round."""

    total: np.ndarray
    weight: float
    weights: dict[int, float]
    server_round: int

    def meta(self) -> dict[str, Any]:
        return {
            "weight": self.weight,
            "weights": {str(k): v for k, v in self.weights.items()},
            "round": self.server_round,
        }

    @classmethod
    def load(cls, total: np.ndarray, meta: Mapping[str, Any]) -> SharedSum:
        return cls(
            np.asarray(total, np.float64),
            float(meta["weight"]),
            {int(k): float(v) for k, v in meta["weights"].items()},
            int(meta["round"]),
        )


class FedAvgSC(FedSC):
    """FedAvg + spectral contrastive: alpha = 1, no correlation matrices."""

    share_correlations = False


class FedAvgBYOL(FedAvgSC):
    """FedAvg + BYOL: the averaged model includes BYOL's predictor."""

    predictor = True


class RepresentationEvaluator:
    """Centralised evaluation of the global encoder where the server can load the labelled data
    (simulation, or a server holding a copy): global kNN each round (memory bank = all clients'
    training splits, queries = the server's test set) and, at the end, a linear probe on frozen
    backbone features trained on all training splits (the paper's protocol)."""

    def __init__(self, settings: Mapping[str, Any], predictor: bool) -> None:
        self.settings = settings
        self.fedsc = FedSCSettings.of(settings)
        self.seed = RunSettings.of(settings).seed
        self.predictor = predictor  # the network has BYOL's predictor

    @cached_property
    def data(self) -> tuple[Any, Any] | None:
        try:
            spec, cache = data_spec(self.settings), cache_dir(self.settings)
            test = load_server_test_data(spec, cache)
            trains = [load_client_data(spec, i, cache).train for i in range(spec.num_clients)]
            if test is None or not any(len(t) for t in trains):
                return None
            x = torch.from_numpy(np.concatenate([t.features() for t in trains]))
            y = torch.from_numpy(np.concatenate([t.y for t in trains])).long()
            return (x, y), (torch.from_numpy(test.features()), torch.from_numpy(test.y).long())
        except Exception as exc:  # the server may hold no data at all
            log.warning("server-side representation evaluation disabled: %s", exc)
            return None

    def new_net(self) -> Any:
        """A freshly initialised ContrastiveNet of the run (`fedsc.encoder`, `dim`, `hidden`;
        BYOL's predictor when the run's network has one)."""
        f = self.fedsc
        shape = model_input(self.settings)[0]
        return build_contrastive_net(f.encoder, shape, f.dim, f.hidden, predictor=self.predictor)

    def net(self, weights: Mapping[str, np.ndarray]) -> Any:
        """The ContrastiveNet holding `weights`, in eval mode."""
        net = self.new_net()
        set_weights(net, weights)
        return net.eval()

    def knn(self, weights: Mapping[str, np.ndarray]) -> dict[str, float]:
        if self.data is None:
            return {}
        (x, y), (tx, ty) = self.data
        net = self.net(weights)
        acc = knn_accuracy(
            embed(net, x),
            y,
            embed(net, tx),
            ty,
            int(max(int(y.max()), int(ty.max())) + 1),
            k=self.fedsc.knn_k,
            temperature=self.fedsc.knn_temperature,
        )
        return {"global-knn-accuracy": acc}

    def linear_probe(self, features: Any) -> tuple[float, float]:
        """(last-epoch, best-epoch) test accuracy of a linear probe on the outputs of the module
        `features` (the paper's protocol: the backbone); needs `data`."""
        assert self.data is not None
        (x, y), (tx, ty) = self.data
        _, classes = model_input(self.settings)
        return linear_probe(
            embed(features, x),
            y,
            embed(features, tx),
            ty,
            classes,
            epochs=self.fedsc.probe_epochs,
            lr=self.fedsc.probe_lr,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def probe(self, weights: Mapping[str, np.ndarray]) -> dict[str, float]:
        if self.data is None:
            return {}
        last, best = self.linear_probe(self.net(weights).backbone)
        return {"probe-accuracy": last, "probe-best-accuracy": best, **self.knn(weights)}
