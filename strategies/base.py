"""The server half of an algorithm, and the federation it talks to.

A strategy writes its round as the algorithm's pseudocode reads: it picks clients, builds each
one's instruction, calls `exchange` once per phase and combines the replies. Messaging, reply
checks, timeouts, metrics files and checkpoints belong to the engine behind `Federation`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from flwr.app import RecordDict

from pollen.core.registry import AlgorithmSpec
from pollen.core.runmodel import ModelFn
from pollen.core.settings import RunSettings, Scalar


class InvalidReply(ValueError):
    """A client's reply is unusable; it is logged and left out of aggregation."""


class InitialArraysError(ValueError):
    """Arrays given to start a run from (a Flower app's `initial_arrays`) do not fit the
    strategy's model."""


def layout_mismatch(given: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> str:
    """Why `given` cannot stand for `expected` (names, shapes), or '' when it can."""
    missing = sorted(set(expected) - set(given))
    extra = sorted(set(given) - set(expected))
    if missing or extra:
        return (
            f"{len(missing)} array(s) missing (e.g. {missing[:2]}), {len(extra)} unknown "
            f"(e.g. {extra[:2]})"
        )
    for key, want in expected.items():
        if np.shape(given[key]) != np.shape(want):
            return f"array {key!r} has shape {np.shape(given[key])}, the model's {np.shape(want)}"
    return ""


def same_arrays(given: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> bool:
    """Whether `given` holds exactly `expected`: the same names, shapes and values."""
    return not layout_mismatch(given, expected) and all(
        np.array_equal(given[k], v) for k, v in expected.items()
    )


@dataclass(frozen=True)
class ClientInfo:
    """A connected client as the server knows it (from its answer to `query.hello`)."""

    cid: int
    node_id: int
    num_train: int
    num_val: int
    num_test: int


@dataclass(frozen=True)
class Summed:
    """A phase whose replies the server may see only summed (secure aggregation,
    docs/security.md#secure-aggregation): of each client's reply it learns nothing but its
    metrics; of the clients together, for each record of `records`, the sum of their arrays
    (minus, for a record `around` names, the instruction's record of that name: the clients'
    updates), each weighted by its num-examples when `weighted`."""

    records: Mapping[str, Mapping[str, np.ndarray]]
    """Each summed record of the replies, as arrays of its layout (names and shapes)."""
    around: Mapping[str, str] = field(default_factory=dict)
    """Reply record -> the instruction's record the reply is an update of."""
    weighted: bool = False
    """Each client weighted by the num-examples it reports (else each counts once)."""
    clip: float = 0.0
    """The encoding's range for these values ([-clip, clip]); 0: the run's `secagg.clip`."""
    l2_clip: float = 0.0
    """Each client clips its (unweighted) vector to this l2 norm first (client-level DP,
    robust.clip); 0: not."""
    noise_std: float = 0.0
    """Distributed DP: the noise's standard deviation on every value of the sum when every
    client of the sum contributes, shared out among them as integer noise (0: none)."""


@dataclass(frozen=True)
class Secured:
    """What a secure exchange gives the strategy (Federation.secure_exchange)."""

    replies: dict[int, RecordDict]
    """The replies of the clients in the sum, in client order, without their arrays."""
    sums: dict[str, dict[str, np.ndarray]]
    """Record -> the weighted sum over those clients of their arrays (updates), float64."""
    weight: float
    """The sum of their weights: their num-examples when weighted, else their number."""
    weights: dict[int, float] = field(default_factory=dict)
    """The weight each client of the sum carries in it (as the client encodes it)."""
    weight_scale: float = 1.0
    """The weight a client's values are encoded at 1 for (weighted: the largest num-examples of
    the sum's clients; else 1): its values' share of the sum is weights[c] / weight_scale."""
    noise_std: float = 0.0
    """The standard deviation of the noise the sum carries (distributed DP: the share of the
    clients in the sum)."""
    release: tuple[float, float, float] | None = None
    """Distributed DP: the Skellam mechanism the sum is, as its accounting takes it (noise
    variance, l1 and l2 sensitivity of one client, in encoded units); None without noise."""

    @property
    def clients(self) -> list[int]:
        return list(self.replies)

    def mean(self, record: str) -> dict[str, np.ndarray]:
        """The weighted mean of a record (float64)."""
        if self.weight <= 0:
            raise ValueError("a secure sum with no weight: nothing to average")
        return {k: v / self.weight for k, v in self.sums[record].items()}


@dataclass(frozen=True)
class BufferedReply:
    """A valid training reply under buffered asynchronous aggregation (FedBuff,
    docs/pacing.md): the client trained the model the server had when it sent round
    `server_round`'s instruction; `staleness` model versions were made since."""

    cid: int
    content: RecordDict
    server_round: int
    staleness: int


Validator = Callable[[int, RecordDict], None]
Fold = Callable[[int, RecordDict], None]
"""Takes one valid reply (client id, content) of an exchange, in client order: a strategy that
folds replies into a running aggregate as they come need not hold them all."""


class Federation(Protocol):
    """What a strategy may ask of the engine during a round."""

    server_round: int
    settings: Mapping[str, Scalar]

    def available(self) -> list[ClientInfo]:
        """Connected clients that train (unseen clients excluded)."""
        ...

    def unseen(self) -> list[ClientInfo]:
        """Connected clients held out of training (`unseen-fraction`)."""
        ...

    def sample(self, clients: Sequence[ClientInfo] | None = None) -> list[ClientInfo]: ...

    def exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        validate: Validator | None = None,
        min_replies: int | None = None,
        fold: Fold | None = None,
    ) -> dict[int, RecordDict]:
        """The valid replies by client id, in client order. With `fold`, each valid reply is
        first handed to it, in client order as soon as every client before it has answered or
        failed, and the returned replies keep only their non-array records (metrics)."""
        ...

    def secure_exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        summed: Summed,
        min_replies: int | None = None,
    ) -> Secured:
        """The phase under secure aggregation (the run's `secagg.*`): the server learns each
        client's metrics and the sum `summed` describes, nothing else of its reply."""
        ...


class Strategy(ABC):
    """Server side of one algorithm. Its state must round-trip through `state`/`load_state`."""

    model_fn: ModelFn | None = None
    """The user's model (pollen.flower), or None: the run's `model`. Strategies whose clients
    train a classifier build their initial model and parameter names from it."""

    def __init__(self, settings: Mapping[str, Scalar]) -> None:
        self.settings = settings
        self.run = RunSettings.of(settings)
        """The run's common settings, typed; an algorithm's own: its contract's SettingsGroup."""

    @abstractmethod
    def initialize(self, seed: int) -> None:
        """Create the initial global state."""

    @abstractmethod
    def run_round(self, fed: Federation) -> dict[str, float]:
        """One round: phases, aggregation; returns the round's aggregated client metrics."""

    def start_from(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Start from `arrays` (a Flower app's `initial_arrays`) in place of the initial
        global state `initialize` made. Strategies with a global model take a model of its
        layout; this default takes only the arrays `global_arrays` holds already."""
        if not same_arrays(arrays, self.global_arrays() or {}):
            raise InitialArraysError(
                f"{type(self).__name__} starts from its own initial state; give no initial "
                "arrays (or the strategy's own, `initial_arrays()`)"
            )

    def finalize(self, fed: Federation) -> dict[str, float]:
        """Evaluation after the last round; one extra exchange only when the algorithm needs it."""
        return {}

    # ---- buffered asynchronous aggregation (FedBuff; registry flag `buffered`) ----------
    def buffered_instruction(self, client: ClientInfo, server_round: int) -> RecordDict:
        """The training instruction a client that is free gets while the server makes round
        `server_round`'s model version: the newest model (server.buffered)."""
        raise NotImplementedError(f"{type(self).__name__} has no buffered step")

    def buffered_check(self, cid: int, content: RecordDict) -> None:
        """InvalidReply when a buffered training reply cannot be used."""
        raise NotImplementedError(f"{type(self).__name__} has no buffered step")

    def buffered_step(self, server_round: int, buffer: Sequence[BufferedReply]) -> dict[str, float]:
        """Round `server_round`'s model version from the buffer's replies; the round's
        aggregated client metrics."""
        raise NotImplementedError(f"{type(self).__name__} has no buffered step")

    def server_evaluate(self) -> dict[str, float]:
        """Centralized evaluation of the global model, if the algorithm has one."""
        return {}

    def global_arrays(self) -> dict[str, np.ndarray] | None:
        """The final model to save, if there is a global one."""
        return None

    def model_arrays(self) -> list[dict[str, np.ndarray]]:
        """The global model(s) as the parameters of the model the clients train, by its own
        names (a Flower app's `evaluate_fn` loads them into its model): the global model, or
        none. FedEM has one per component, FeDLRT gives its low-rank layers as dense weights."""
        arrays = self.global_arrays()
        return [] if arrays is None else [arrays]

    def privacy_guarantees(self) -> dict[str, dict[str, Any]]:
        """Differential-privacy guarantees of the algorithm's own (FedSC's DP-CalR) for
        summary.json's `privacy` entry, beside DP-SGD's and client-level DP's, which the
        engine states from the settings: name -> epsilon, delta, mechanism, what it protects."""
        return {}

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays and JSON-able data that restore this strategy exactly."""
        return {}, {}

    def load_state(  # noqa: B027 (optional: stateless strategies need nothing)
        self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]
    ) -> None:
        """Inverse of `state`."""


def strategy_class(spec: AlgorithmSpec) -> type[Strategy]:
    """The server half's Strategy class, loaded by the name the registry gives
    (`spec.strategy`): the registry holds names, never the halves."""
    module, _, attr = spec.strategy.partition(":")
    cls: type[Strategy] = getattr(importlib.import_module(module), attr)
    return cls
