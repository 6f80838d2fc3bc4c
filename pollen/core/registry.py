"""Algorithm registry: a name resolves here to its server strategy, client handlers and settings.

Entries name their code by import path so that looking an algorithm up imports nothing heavy:
a ClientApp process imports only the handlers of the message it serves. A run's settings (the
common ones of pollen.core.settings and every algorithm's) are resolved and checked here too.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pollen.core.contracts import fedlrt as fedlrt_contract
from pollen.core.contracts.adept import (
    AdeptAESettings,
    AdeptDGMSettings,
    AdeptPCASettings,
    AdeptSettings,
)
from pollen.core.contracts.clustered import ClusteredSettings
from pollen.core.contracts.fedavg import FedAvgPlusSettings, FedProxSettings
from pollen.core.contracts.fedem import DFedEMSettings, FedEMSettings
from pollen.core.contracts.fedlrt import FeDLRTSettings
from pollen.core.contracts.fedsc import (
    CORRELATION_PHASE,
    BYOLSettings,
    FedSCSettings,
    SimCLRSettings,
)
from pollen.core.contracts.noop import NoOpSettings
from pollen.core.contracts.scaffold import CONTROL_DELTA
from pollen.core.protocol import HELLO
from pollen.core.settings import (
    COMMON_SETTINGS,
    ROBUST_RULES,
    AttackSettings,
    ClientDPSettings,
    DPSettings,
    RobustSettings,
    RunSettings,
    Scalar,
    Setting,
    SettingsError,
    SyntheticSettings,
)
from robust.client_dp import count_std, update_noise_multiplier
from robust.rules import breakdown_note, clients_needed


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    description: str
    strategy: str  # "module:Class"
    client: str  # "module" with HANDLERS, or "module:NAME": dict[message_type, handler]
    message_types: tuple[str, ...]
    settings: tuple[Setting, ...] = ()
    once: tuple[str, ...] = ()
    """Message types not sent in every round (FeDLRT's warm start, before its first round when
    the run asks for one)."""
    small: Mapping[str, Scalar] = field(default_factory=dict)
    """Settings that make a run of it small (seconds on one CPU core) and still go through every
    phase of its round: what the tests that run every registered algorithm add to theirs."""
    uses: tuple[str, ...] = ()
    """Groups of other algorithms' settings this one reads too (`fedem` for D-FedEM)."""
    uses_torch: bool = True
    """Its client handlers import torch (with `client-timing` the ClientApp imports it first, to
    time the import apart)."""
    amp: bool = False
    """Its local training runs under mixed precision with `amp=true` (the shared loops of
    client.training); an algorithm without it refuses `amp=true` before anything starts: its
    math must stay float32 (FeDLRT's bases and coefficients, FedSC's correlation matrices) or
    its loops are its own (ADEPT)."""
    evaluates_received: bool = True
    """Its training reply's evaluation metrics (`model_round`) describe the model the client
    received, i.e. the one after the previous round's aggregation; False: the model after the
    client's training in that round (Local's personal model)."""
    dp: bool = False
    """Its clients train supervised models with the shared SGD loop, which runs as DP-SGD when
    the run asks for it (`dp.*`, docs/privacy.md); an algorithm without it refuses DP before
    anything starts."""
    client_dp: bool = False
    """It takes client-level DP (`client-dp.*`, docs/privacy.md#client-level-dp): the
    arrays of its `train` reply (a model around the arrays it was sent with `model_reply`,
    else an update around 0) and its `update_records` are the client's update of the round,
    clipped and noised together; without it, client-level DP is refused with
    `client_dp_note` as the reason."""
    client_dp_note: str = ""
    update_records: tuple[str, ...] = ()
    """Records of its `train` reply, beside the arrays, that are updates around 0 (SCAFFOLD's
    delta_c)."""
    robust_rules: tuple[str, ...] = ROBUST_RULES
    """The `robust.rule`s it takes; another is refused before anything starts, with
    `robust_note` as the reason (docs/robustness.md#per-algorithm)."""
    robust_note: str = ""
    labels: bool = True
    """Its clients train on labels (a label-flip attack has something to flip)."""
    model_reply: bool = False
    """Its `train` reply carries, as its arrays, the model the client trained from the arrays
    it was sent: what a node's own attack (node config `attack`) changes."""
    local_steps: bool = False
    """Its local training can count its work in SGD steps (`local-steps` > 0; the shared
    classifier loop of client.training); an algorithm without it refuses local-steps > 0
    before anything starts: its loops count epochs of their own (FedSC's two views, ADEPT's)."""

    def round_phases(self) -> tuple[str, ...]:
        """The phases of one round, in order: its message types but those sent once and the
        final evaluation."""
        return tuple(m for m in self.message_types if m not in self.once and m != "evaluate")

    def setting_groups(self) -> set[str]:
        """The prefixes (`fedem` of `fedem.components`) of every setting this algorithm reads."""
        groups = {s.key.split(".")[0] for s in self.settings if "." in s.key} | set(self.uses)
        groups |= {ClientDPSettings.PREFIX} if self.client_dp else set()
        return groups | ({DPSettings.PREFIX} if self.dp else set())


ADEPT_MESSAGES = ("train", "evaluate")

SMALL_FEDSC: dict[str, Scalar] = {
    "fedsc.dim": 8, "fedsc.passes": 1, "fedsc.views-per-pass": 1, "fedsc.knn-k": 5,
    "fedsc.probe-epochs": 1, "batch-size": 64,
}  # fmt: skip

ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec(
            name="fedavg",
            description="FedAvg: local SGD, server average weighted by training examples",
            strategy="strategies.fedavg:FedAvg",
            client="client.fedavg",
            message_types=("train", "evaluate"),
            amp=True,
            dp=True,
            local_steps=True,
            model_reply=True,
            client_dp=True,
        ),
        AlgorithmSpec(
            name="fedavg-plus",
            description="FedAvg+: FedAvg whose clients fine-tune the global model locally "
            "before every evaluation (the global model is unaffected)",
            strategy="strategies.fedavg:FedAvg",
            client="client.fedavg:ADAPTING_HANDLERS",
            message_types=("train", "evaluate"),
            settings=FedAvgPlusSettings.declarations(),
            amp=True,
            dp=True,
            local_steps=True,
            model_reply=True,
            client_dp=True,
        ),
        AlgorithmSpec(
            name="fedprox",
            description="FedProx: FedAvg with a proximal term (mu/2)||w - w_global||^2 on clients",
            strategy="strategies.fedavg:FedAvg",
            client="client.fedavg:PROXIMAL_HANDLERS",
            message_types=("train", "evaluate"),
            settings=FedProxSettings.declarations(),
            amp=True,
            dp=True,
            local_steps=True,
            model_reply=True,
            client_dp=True,
        ),
        AlgorithmSpec(
            name="fedem",
            description="FedEM: each client a mixture of M shared component models, "
            "personal mixture weights fitted by EM",
            strategy="strategies.fedem:FedEM",
            client="client.fedem",
            message_types=("train", "evaluate"),
            small={"fedem.components": 2},
            settings=FedEMSettings.declarations(),
            amp=True,
            dp=True,
            local_steps=True,
            model_reply=True,
            client_dp=True,
        ),
        AlgorithmSpec(
            name="d-fedem",
            description="D-FedEM: decentralised FedEM; clients gossip their components over a "
            "random graph, no global model (uses the fedem.* settings)",
            strategy="strategies.dfedem:DFedEM",
            client="client.fedem",
            message_types=("train", "evaluate"),
            small={"fedem.components": 2},
            uses=("fedem",),
            settings=DFedEMSettings.declarations(),
            robust_rules=("mean", "centered-clip"),
            robust_note="each client mixes its own neighbourhood with fixed gossip weights: "
            "centered-clip is ClippedGossip there (each neighbour's difference clipped around "
            "the client's own model), and mean takes robust.clip the same way",
            amp=True,
            dp=True,
            local_steps=True,
            model_reply=True,
            client_dp_note=(
                "it has no server sum to noise: each client's next model mixes its "
                "neighbours' models, each one of them a single client's"
            ),
        ),
        AlgorithmSpec(
            name="clustered",
            description="Clustered FL: one model per cluster of clients; a cluster is split in "
            "two by the cosine similarity of its members' updates once they cancel on average",
            strategy="strategies.clustered:Clustered",
            client="client.clustered",
            message_types=("train", "evaluate"),
            settings=ClusteredSettings.declarations(),
            amp=True,
            dp=True,
            local_steps=True,
            model_reply=True,
            client_dp_note=(
                "the split decision reads each client's update un-noised (their cosine "
                "similarities)"
            ),
        ),
        AlgorithmSpec(
            name="fedlrt",
            description="FeDLRT: federated dynamical low-rank training; chosen linear layers "
            "are U S V^T with server-side basis augmentation and SVD truncation, clients train "
            "the augmented coefficients with optional variance correction",
            strategy="strategies.fedlrt:FeDLRT",
            client="client.fedlrt",
            message_types=fedlrt_contract.FEDLRT_PHASES,
            once=(fedlrt_contract.WARM_START,),
            small={"fedlrt.var-cor": "full", "fedlrt.max-rank": 8},
            settings=FeDLRTSettings.declarations(),
            local_steps=True,
            client_dp_note=(
                "a round releases three combinations of each client's data (basis gradients, "
                "the correction's mean, the coefficients), whose joint sensitivity to one "
                "client is not one clipping bound"
            ),
        ),
        AlgorithmSpec(
            name="fedlin",
            description="FedLin: local SGD corrected by the difference between the average "
            "and the client's full gradient at the round's start (2 phases)",
            strategy="strategies.fedlrt:FedLin",
            client="client.fedlrt:FEDLIN_HANDLERS",
            message_types=fedlrt_contract.FEDLIN_PHASES,
            once=(fedlrt_contract.WARM_START,),
            uses=("fedlrt",),
            local_steps=True,
            client_dp_note=(
                "a round releases two combinations of each client's data (its full gradient "
                "for the correction, then its model), whose joint sensitivity to one client "
                "is not one clipping bound"
            ),
        ),
        AlgorithmSpec(
            name="fedsc",
            description="FedSC: federated spectral contrastive self-supervised learning; "
            "clients share DP-protected correlation matrices of their representations",
            strategy="strategies.fedsc:FedSC",
            client="client.fedsc",
            message_types=(CORRELATION_PHASE, "train", "evaluate"),
            small=SMALL_FEDSC,
            settings=FedSCSettings.declarations(),
            labels=False,
            model_reply=True,
            client_dp_note=(
                "its clients also release correlation matrices each round, protected per "
                "example by DP-CalR (fedsc.*), not per client"
            ),
        ),
        AlgorithmSpec(
            name="fedavg-sc",
            description="FedAvg + spectral contrastive loss (FedSC with alpha = 1 and nothing "
            "shared; uses the fedsc.* settings)",
            strategy="strategies.fedsc:FedAvgSC",
            client="client.fedsc",
            message_types=("train", "evaluate"),
            small=SMALL_FEDSC,
            uses=("fedsc",),
            labels=False,
            model_reply=True,
            client_dp=True,
        ),
        AlgorithmSpec(
            name="fedavg-simclr",
            description="FedAvg + SimCLR (NT-Xent loss on two views; nothing shared; uses the "
            "fedsc.* encoder, augmentation and evaluation settings)",
            strategy="strategies.fedsc:FedAvgSC",
            client="client.fedsc:SIMCLR_HANDLERS",
            message_types=("train", "evaluate"),
            small=SMALL_FEDSC,
            uses=("fedsc",),
            settings=SimCLRSettings.declarations(),
            labels=False,
            amp=True,
            model_reply=True,
            client_dp=True,
        ),
        AlgorithmSpec(
            name="fedavg-byol",
            description="FedAvg + BYOL (online network with predictor, EMA target reset to the "
            "global model each round; nothing shared; uses the fedsc.* encoder, augmentation "
            "and evaluation settings)",
            strategy="strategies.fedsc:FedAvgBYOL",
            client="client.fedsc:BYOL_HANDLERS",
            message_types=("train", "evaluate"),
            small=SMALL_FEDSC,
            uses=("fedsc",),
            settings=BYOLSettings.declarations(),
            labels=False,
            amp=True,
            model_reply=True,
            client_dp=True,
        ),
        AlgorithmSpec(
            name="adept-pca",
            description="ADEPT-PCA: personal principal subspaces U_i and a global V on the "
            "Stiefel manifold, tied by a prior whose width sigma is learned",
            strategy="strategies.adept:ADEPTPCA",
            client="client.adept:PCA_HANDLERS",
            message_types=ADEPT_MESSAGES,
            small={
                "dataset": "pca-synthetic", "partitioner": "natural", "val-fraction": 0.0,
                "synthetic.dimension": 12, "synthetic.rank": 3, "synthetic.train-size": 10,
                "synthetic.test-size": 20, "adept-pca.rank": 3, "lr": 2e-3,
            },
            settings=AdeptSettings.declarations() + AdeptPCASettings.declarations(),
            labels=False,
            client_dp_note=(
                "its server step learns sigma from the spread of the clients' parameters, "
                "which is not a mean of clipped updates"
            ),
        ),
        AlgorithmSpec(
            name="adept-ae",
            description="ADEPT-AE: personal autoencoders theta_i, a global mu and a per-weight "
            "sigma learned by the federation (uses the adept.* settings)",
            strategy="strategies.adept:ADEPTAE",
            client="client.adept:AE_HANDLERS",
            message_types=ADEPT_MESSAGES,
            small={"adept-ae.latent": 4, "adept-ae.local-steps": 2},
            uses=("adept",),
            settings=AdeptAESettings.declarations(),
            labels=False,
            client_dp_note=(
                "its server step learns sigma from the spread of the clients' parameters, "
                "which is not a mean of clipped updates"
            ),
        ),
        AlgorithmSpec(
            name="adept-dgm",
            description="ADEPT-DGM: personal UNet denoisers (diffusion models) theta_i, a global "
            "mu and a per-weight sigma (uses the adept.* settings and adept-ae's local-steps, "
            "prior-scale, mu-gradient, lazy-rounds)",
            strategy="strategies.adept:ADEPTDGM",
            client="client.adept:DGM_HANDLERS",
            message_types=ADEPT_MESSAGES,
            small={
                "adept-dgm.channels": 4, "adept-dgm.kernel": 3, "adept-ae.local-steps": 2,
                "adept-dgm.samples": 8, "adept-dgm.sample-steps": 3, "adept-dgm.kid-subsets": 2,
                "adept-dgm.feature-epochs": 1, "lr": 1e-3,
            },
            uses=("adept", "adept-ae"),
            settings=AdeptDGMSettings.declarations(),
            labels=False,
            client_dp_note=(
                "its server step learns sigma from the spread of the clients' parameters, "
                "which is not a mean of clipped updates"
            ),
        ),
        AlgorithmSpec(
            name="scaffold",
            description="SCAFFOLD: local SGD corrected by control variates c - c_i (server's "
            "minus client's, option II), against client drift; c_i kept in the client state",
            strategy="strategies.scaffold:Scaffold",
            client="client.scaffold",
            message_types=("train", "evaluate"),
            amp=True,
            dp=True,
            local_steps=True,
            client_dp=True,
            update_records=(CONTROL_DELTA,),
        ),
        AlgorithmSpec(
            name="local",
            description="Local training only: each client keeps its own model, nothing is shared",
            strategy="strategies.local:LocalOnly",
            client="client.local",
            message_types=("train", "evaluate"),
            robust_rules=("mean",),
            robust_note="local training combines nothing",
            amp=True,
            evaluates_received=False,  # it tests its personal model after the round's training
            dp=True,
            local_steps=True,
            client_dp_note=(
                "local training combines nothing: nothing but metrics leaves a client"
            ),
        ),
        AlgorithmSpec(
            name="noop",
            description="No-op exchanges: measures the messaging floor of a runtime",
            strategy="strategies.noop:NoOp",
            client="client.noop",
            message_types=("query.noop",),
            small={"noop.payload-kb": 1},
            uses_torch=False,
            settings=NoOpSettings.declarations(),
            robust_rules=("mean",),
            robust_note="the no-op combines nothing",
            labels=False,
            client_dp_note=(
                "the no-op combines nothing"
            ),
        ),
    )
}



def all_message_types() -> tuple[str, ...]:
    types = {HELLO}
    for spec in ALGORITHMS.values():
        types.update(spec.message_types)
    return tuple(sorted(types))


def get_algorithm(name: str) -> AlgorithmSpec:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(
            f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}"
        ) from None


# ---- a run's settings: the common ones and every algorithm's, resolved and checked ----------


def _by_key(settings: Iterable[Setting]) -> dict[str, Setting]:
    out: dict[str, Setting] = {}
    for s in settings:
        if s.key in out:
            raise ValueError(f"setting '{s.key}' declared twice")
        out[s.key] = s
    return out


def all_settings() -> dict[str, Setting]:
    """Every declared setting: the common ones and each algorithm's own."""
    declared: list[Setting] = list(COMMON_SETTINGS)
    for spec in ALGORITHMS.values():
        declared.extend(spec.settings)
    return _by_key(declared)


def defaults() -> dict[str, Scalar]:
    return {key: s.default for key, s in all_settings().items()}


def resolve(
    overrides: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> dict[str, Scalar]:
    """Defaults, then `base`, then `overrides`; every key known, every value checked."""
    declared = all_settings()
    out: dict[str, Scalar] = {k: s.default for k, s in declared.items()}
    for layer in (base or {}, overrides):
        for key, value in layer.items():
            if key not in declared:
                raise SettingsError(f"unknown setting '{key}'{_closest(key, declared)}")
            out[key] = declared[key].coerce(value)
    _check_consistency(out)
    return out


def _check_consistency(cfg: Mapping[str, Scalar]) -> None:
    if cfg["algorithm"] not in ALGORITHMS:
        raise SettingsError(
            f"unknown algorithm {cfg['algorithm']!r}{_closest(str(cfg['algorithm']), ALGORITHMS)}"
            f"; known: {', '.join(sorted(ALGORITHMS))}"
        )
    spec = ALGORITHMS[str(cfg["algorithm"])]
    if cfg["amp"] and not spec.amp:
        supported = ", ".join(sorted(n for n, a in ALGORITHMS.items() if a.amp))
        raise SettingsError(
            f"amp=true: {spec.name} trains in float32 only (docs/deployment.md#gpu); "
            f"mixed precision is for {supported}"
        )
    _check_dp(cfg, spec)
    _check_robust(cfg, spec)
    _check_client_dp(cfg, spec)
    if int(cfg["local-steps"]) > 0 and not spec.local_steps:
        supported = ", ".join(sorted(n for n, a in ALGORITHMS.items() if a.local_steps))
        raise SettingsError(
            f"local-steps={cfg['local-steps']}: {spec.name} counts its local work in "
            f"local-epochs only; local-steps is for {supported}"
        )
    _check_true_decoder(cfg)
    if float(cfg["val-fraction"]) + float(cfg["test-fraction"]) >= 0.95:
        raise SettingsError("val-fraction + test-fraction must leave data to train on (< 0.95)")
    if int(cfg["min-replies"]) > int(cfg["num-clients"]):
        raise SettingsError(
            f"min-replies ({cfg['min-replies']}) exceeds num-clients ({cfg['num-clients']})"
        )
    if int(cfg["min-available-clients"]) > int(cfg["num-clients"]):
        raise SettingsError(
            f"min-available-clients ({cfg['min-available-clients']}) exceeds "
            f"num-clients ({cfg['num-clients']})"
        )


def _check_dp(cfg: Mapping[str, Scalar], spec: AlgorithmSpec) -> None:
    """DP-SGD only where the clients' training supports it, one way of setting its noise, and
    not with mixed precision."""
    dp = DPSettings.of(cfg)
    if not dp.enabled:
        return
    if not spec.dp:
        supported = ", ".join(sorted(n for n, a in ALGORITHMS.items() if a.dp))
        raise SettingsError(
            f"dp.noise-multiplier / dp.target-epsilon: {spec.name} has no DP-SGD training "
            f"(docs/privacy.md); DP-SGD is for {supported}"
        )
    if dp.noise_multiplier > 0 and dp.target_epsilon > 0:
        raise SettingsError(
            "dp.noise-multiplier and dp.target-epsilon both set: give one (the noise, or the "
            "epsilon the noise is calibrated to)"
        )
    if cfg["amp"]:
        raise SettingsError(
            "amp=true with DP-SGD: refused; per-example gradients are clipped and noised in "
            "float32 (docs/privacy.md)"
        )
    if cfg["drop-last"]:
        raise SettingsError(
            "drop-last=true with DP-SGD: refused; Poisson-sampled batches have no last batch to "
            "drop (docs/privacy.md)"
        )
    if int(cfg["local-steps"]) > 0:
        raise SettingsError(
            f"local-steps={cfg['local-steps']} with DP-SGD: refused; DP-SGD's steps are "
            "local-epochs passes of Poisson-sampled batches, which its privacy accounting counts "
            "(docs/privacy.md)"
        )


def _check_client_dp(cfg: Mapping[str, Scalar], spec: AlgorithmSpec) -> None:
    """Client-level DP only where the algorithm's aggregation has a stated sensitivity, one
    way of setting its noise, robust rules only where they are post-processing (noise on the
    clients), Poisson sampling that honours no minimum, and a planned epsilon within the
    budget (docs/privacy.md#client-level-dp)."""
    dp = ClientDPSettings.of(cfg)
    if not dp.enabled:
        return
    if not spec.client_dp:
        supported = ", ".join(sorted(n for n, a in ALGORITHMS.items() if a.client_dp))
        raise SettingsError(
            f"client-dp: {spec.name} refuses client-level DP ({spec.client_dp_note}); it is for "
            f"{supported}"
        )
    if dp.noise_multiplier > 0 and dp.target_epsilon > 0:
        raise SettingsError(
            "client-dp.noise-multiplier and client-dp.target-epsilon both set: give one (the "
            "noise, or the epsilon the noise is calibrated to)"
        )
    run, robust = RunSettings.of(cfg), RobustSettings.of(cfg)
    if dp.noise_at == "client":
        if dp.adaptive:
            raise SettingsError(
                "client-dp.target-quantile with client-dp.noise-at=client: refused; adaptive "
                "clipping releases the noised count of unclipped updates, which only the server "
                "can noise (a client's own bit would reach it in the clear)"
            )
    else:
        if robust.rule != "mean":
            raise SettingsError(
                f"robust.rule={robust.rule} with client-level DP noised on the server: refused; "
                "the noise is calibrated to a mean that one client moves by at most clip / m, "
                f"which {robust.rule} does not guarantee. Use client-dp.noise-at=client (any "
                "rule is then post-processing of noised updates) or robust.rule=mean"
            )
        if robust.clip_quantile > 0:
            raise SettingsError(
                "robust.clip-quantile with client-level DP noised on the server: refused; the "
                "bound would be read from the updates un-noised. Use client-dp.target-quantile "
                "(adaptive clipping with a noised count)"
            )
        if robust.nnm or robust.bucket > 1:
            raise SettingsError(
                "robust.nnm / robust.bucket with client-level DP noised on the server: refused; "
                "they mix clients' updates before the noisy sum, so one client would move "
                "several of its terms"
            )
        if run.fraction_train <= 0:
            raise SettingsError(
                "client-level DP with fraction-train=0: each client takes part in a round with "
                "probability fraction-train; give it above 0"
            )
        if run.fraction_train < 1 and run.min_train_clients > 1:
            raise SettingsError(
                f"min-train-clients={run.min_train_clients} with client-level DP and "
                f"fraction-train={run.fraction_train:g}: refused; clients are sampled "
                "independently (Poisson sampling, as the privacy analysis assumes), which "
                "honours no minimum"
            )
    from pollen.core.contracts import client_dp  # lazy: opacus

    try:
        mech = client_dp.mechanism(cfg)
        assert mech is not None  # enabled
        if dp.adaptive:
            update_noise_multiplier(mech.noise_multiplier,
                                    count_std(mech.denominator, dp.count_std))  # fmt: skip
        planned = client_dp.planned_epsilon(mech, run.num_rounds)
    except ValueError as exc:
        raise SettingsError(f"client-dp: {exc}") from None
    if dp.max_epsilon > 0 and planned > dp.max_epsilon:
        raise SettingsError(
            f"client-dp: {run.num_rounds} rounds at noise multiplier "
            f"{mech.noise_multiplier:.4g} would spend epsilon {planned:.3g} (delta "
            f"{dp.delta:g}), above the budget client-dp.max-epsilon={dp.max_epsilon:g}; lower "
            "num-rounds, raise client-dp.noise-multiplier or give client-dp.target-epsilon"
        )


def expected_round_clients(cfg: Mapping[str, Scalar]) -> int:
    """How many clients a round samples when every training client is connected (the
    engine's sampling: max(min-train-clients, ceil(fraction-train x pool)), at most the pool)."""
    run = RunSettings.of(cfg)
    pool = run.training_clients
    want = max(run.min_train_clients, math.ceil(run.fraction_train * pool))
    return min(want, pool)


def _check_robust(cfg: Mapping[str, Scalar], spec: AlgorithmSpec) -> None:
    """A robust rule the algorithm takes, sized for the clients a round will have; attackers
    that exist and train; a label-flip attack only where clients train on labels."""
    robust, attack = RobustSettings.of(cfg), AttackSettings.of(cfg)
    if robust.rule not in spec.robust_rules:
        raise SettingsError(
            f"robust.rule={robust.rule}: {spec.name} takes {', '.join(spec.robust_rules)} "
            f"only ({spec.robust_note}; docs/robustness.md)"
        )
    if spec.robust_rules == ("mean",) and (
        robust.clip > 0 or robust.clip_quantile > 0 or robust.nnm or robust.bucket > 1
    ):
        raise SettingsError(
            f"robust.clip / clip-quantile / nnm / bucket: {spec.name} refuses them "
            f"({spec.robust_note})"
        )
    n = expected_round_clients(cfg)
    need = clients_needed(robust.rule, robust.f, robust.bucket, robust.nnm)
    if n < need:
        per = f" (in buckets of {robust.bucket})" if robust.bucket > 1 else ""
        mixing = " and more than f for robust.nnm" if robust.nnm else ""
        raise SettingsError(
            f"robust.rule={robust.rule} with robust.f={robust.f} needs "
            f"{breakdown_note(robust.rule)}{mixing}, i.e. at least {need} updates a round{per}, "
            f"but a round has {n} clients; lower robust.f or sample more clients"
        )
    ids = attack.ids()
    if not ids:
        return
    run = RunSettings.of(cfg)
    pool = run.training_clients
    outside = [i for i in ids if i >= pool]
    if outside:
        raise SettingsError(
            f"attack.clients: {outside} are not training clients (ids 0 to {pool - 1})"
        )
    if attack.kind == "label-flip" and not spec.labels:
        raise SettingsError(
            f"attack.kind=label-flip: {spec.name} trains without labels; choose an attack on "
            "the updates (sign-flip, gaussian, alie, ...)"
        )
    if spec.robust_rules == ("mean",):
        raise SettingsError(
            f"attack.clients: {spec.name} has nothing to attack ({spec.robust_note})"
        )


def _check_true_decoder(cfg: Mapping[str, Scalar]) -> None:
    """adept-ae.init-decoder=truth needs the generator's decoders: dataset ae-synthetic, and a
    latent size equal to theirs."""
    if AdeptAESettings.of(cfg).init_decoder != "truth":
        return
    run, synthetic = RunSettings.of(cfg), SyntheticSettings.of(cfg)
    if run.dataset != "ae-synthetic":
        raise SettingsError(
            f"adept-ae.init-decoder=truth starts each decoder at the client's true generator, "
            f"which only dataset 'ae-synthetic' has (dataset is {run.dataset!r})"
        )
    if AdeptAESettings.of(cfg).latent != synthetic.rank:
        raise SettingsError(
            f"adept-ae.init-decoder=truth: adept-ae.latent ({AdeptAESettings.of(cfg).latent}) "
            f"must equal the generator's latent size synthetic.rank ({synthetic.rank})"
        )


def _closest(name: str, known: Iterable[str]) -> str:
    """' (did you mean X?)' for the nearest known names, or ''."""
    names = list(known)
    close = difflib.get_close_matches(name, names, n=2, cutoff=0.6)
    close += [k for k in names if k.split(".")[-1] == name.split(".")[-1] and k not in close]
    return f" (did you mean {' or '.join(close[:3])}?)" if close else ""


def model_round(algorithm: str, key: str, rnd: int) -> int:
    """The round whose model a client metric `key` of round `rnd`'s training reply describes
    (0: the initial model), where reports and TensorBoard place it. Evaluation metrics (test-*,
    a -test- part, *accuracy*) describe the model the client received unless the algorithm
    evaluates after training (`AlgorithmSpec.evaluates_received`); the others (train-loss, ...)
    the round's training. An algorithm this version does not know counts as evaluating the
    received model."""
    spec = ALGORITHMS.get(algorithm)
    received = spec.evaluates_received if spec is not None else True
    evaluation = not key.startswith("train-") and (
        key.startswith("test-") or "-test-" in key or "accuracy" in key
    )
    return rnd - 1 if evaluation and received else rnd


def foreign_settings(algorithm: str, keys: Iterable[str]) -> dict[str, list[str]]:
    """The keys among `keys` that `algorithm` does not read, each with the algorithms that do
    (`fedprox.mu` for `fedavg`: ['fedprox']). Common settings belong to every algorithm, except
    `dp.*` (to the algorithms with DP-SGD) and `client-dp.*` (with client-level DP)."""
    spec = ALGORITHMS.get(algorithm)
    if spec is None:
        return {}
    mine = spec.setting_groups()
    # synthetic.* too, though it has a prefix
    private = DPSettings.declarations() + ClientDPSettings.declarations()
    common = {s.key for s in COMMON_SETTINGS} - {s.key for s in private}
    out: dict[str, list[str]] = {}
    for key in keys:
        group = key.split(".")[0] if "." in key else None
        if group is None or group in mine or key in common:
            continue
        out[key] = sorted(n for n, a in ALGORITHMS.items() if group in a.setting_groups())
    return out


def from_run_config(run_config: Mapping[str, Any]) -> dict[str, Scalar]:
    """Settings of a running app: Flower's run config, checked like CLI input."""
    declared = all_settings()
    known = {k: v for k, v in run_config.items() if k in declared}
    return resolve(known)
