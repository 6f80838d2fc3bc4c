"""Algorithm registry: a name resolves here to its server strategy, client handlers and settings.

Entries name their code by import path so that looking an algorithm up imports nothing heavy:
a ClientApp process imports only the handlers of the message it serves. A run's settings are
resolved and checked against the entries by pollen.core.runconfig.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pollen.core.contracts import fedlrt as fedlrt_contract
from pollen.core.contracts import secagg as secagg_contract
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
from pollen.core.protection import ROBUST_RULES, ClientDPSettings, DPSettings
from pollen.core.protocol import HELLO
from pollen.core.settings import Scalar, Setting


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
    secagg: bool = False
    """It takes secure aggregation (`secagg.*`, docs/security.md#secure-aggregation): every
    point where its server combines clients is a (weighted) sum, which the clients mask;
    without it, secure aggregation is refused with `secagg_note` as the reason."""
    secagg_note: str = ""
    buffered: bool = False
    """It takes buffered asynchronous aggregation (`async.*`, FedBuff, docs/pacing.md): its
    server half folds staleness-weighted buffers of training replies into model versions
    (Strategy.buffered_instruction, buffered_step); without it, `async.buffer` > 0 is refused
    with `buffered_note` as the reason."""
    buffered_note: str = ""
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
            buffered=True,
            description="FedAvg: local SGD, server average weighted by training examples",
            strategy="strategies.fedavg:FedAvg",
            client="client.fedavg",
            message_types=("train", "evaluate"),
            amp=True,
            dp=True,
            local_steps=True,
            model_reply=True,
            client_dp=True,
            secagg=True,
        ),
        AlgorithmSpec(
            name="fedavg-plus",
            buffered=True,
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="fedprox",
            buffered=True,
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="fedem",
            buffered=True,
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="d-fedem",
            buffered_note=(
                "D-FedEM mixes the clients' models along its gossip graph round by round; there "
                "is no server model to step"
            ),
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
            secagg_note=(
                "its gossip hands each client its neighbours' own models, one client's "
                "each: there is no sum to hide them in"
            ),
        ),
        AlgorithmSpec(
            name="clustered",
            buffered_note="Clustered FL splits clusters from a round's updates taken together",
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
            secagg_note=(
                "its split decision reads each client's update (their cosine "
                "similarities)"
            ),
        ),
        AlgorithmSpec(
            name="fedlrt",
            buffered_note=(
                "FeDLRT's clients train in a basis built from the gradients of the round's "
                "clients together: its phases are synchronous by construction"
            ),
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="fedlin",
            buffered_note=(
                "FedLin's clients train with a correction built from the gradients of the round's"
                " clients together: its phases are synchronous by construction"
            ),
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="fedsc",
            buffered_note=(
                "FedSC's clients train against the correlation matrix of the round's clients "
                "together: its phases are synchronous by construction"
            ),
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="fedavg-sc",
            buffered_note="its server half has no buffered step",
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="fedavg-simclr",
            buffered_note="its server half has no buffered step",
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="fedavg-byol",
            buffered_note="its server half has no buffered step",
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="adept-pca",
            buffered_note="ADEPT learns sigma from the round's clients together with the model",
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="adept-ae",
            buffered_note="ADEPT learns sigma from the round's clients together with the model",
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="adept-dgm",
            buffered_note="ADEPT learns sigma from the round's clients together with the model",
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="scaffold",
            buffered_note=(
                "SCAFFOLD's control variates are stepped with the round's clients together, "
                "beside the model"
            ),
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
            secagg=True,
        ),
        AlgorithmSpec(
            name="local",
            buffered_note="local training combines nothing",
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
            secagg_note="local training combines nothing: nothing but metrics leaves a client",
        ),
        AlgorithmSpec(
            name="noop",
            buffered_note="the no-op combines nothing",
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
            secagg_note="the no-op combines nothing",
        ),
    )
}



def all_message_types() -> tuple[str, ...]:
    """Every message type a client answers: the hello, secure aggregation's stages and each
    algorithm's phases."""
    types = {HELLO, *secagg_contract.STAGES}
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
