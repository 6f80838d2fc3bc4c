"""Pollen's algorithms as Flower strategies: subclasses of `flwr.serverapp.strategy.Strategy`
for a Flower project's own ServerApp (docs/flower-apps.md).

Each class is one algorithm of the registry, constructed with keyword arguments named after its
settings (`FedEM(components=3, local_epochs=2)`; `keyword_settings("fedem")` lists them), every
one defaulted and checked when the object is made. `start` has the signature of Flower's and
returns Flower's `Result`, and runs Pollen's round engine (server.engine) underneath: clients
greeted and given stable ids, sampling, every phase of the algorithm's round, every reply
checked before the algorithm sees it, robust rules and differential privacy where the settings
ask for them, metrics files and checkpoints in `out_dir`.

Flower's hooks (`configure_train`, `aggregate_train`, `configure_evaluate`,
`aggregate_evaluate`) drive the same algorithm one exchange at a time (pollen.flower.hooks),
for algorithms whose round is one exchange. FeDLRT, FedLin and FedSC exchange several times per
round (FeDLRT's basis, coefficient-gradient and coefficient phases, Schotthöfer & Laiu, 2024;
FedSC's correlation matrices before training, Jing et al., ICML 2024, Algorithm 1), which
Flower's train/evaluate pair cannot express: for them `start` is the entry point, and their
hooks say so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from pollen.core import protocol
from pollen.core.protection import SecAggSettings
from pollen.core.registry import get_algorithm
from pollen.core.runconfig import resolve
from pollen.core.rundir import RoundRow
from pollen.core.runmodel import ModelFn
from pollen.core.settings import RunSettings, Scalar, SettingsError
from pollen.flower.hooks import HookRounds
from pollen.flower.wire import OWN_MODEL, overrides, with_settings
from server.engine import Engine
from server.results import ResultsWriter
from strategies.base import Strategy as ServerHalf
from strategies.base import strategy_class

log = logging.getLogger("flwr.pollen")

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


def to_array_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Numpy arrays as Flower's ArrayRecord, one Array per name (what
    `ArrayRecord.to_torch_state_dict` reads)."""
    # np.array(order="C"), not np.ascontiguousarray, which turns 0-d arrays (a BatchNorm's
    # num_batches_tracked) into 1-d ones
    return ArrayRecord({k: Array(np.array(v, order="C")) for k, v in arrays.items()})


def from_array_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord (a torch state dict's, or Pollen's bundle) as numpy arrays."""
    if list(record.keys()) == [protocol.BUNDLE]:
        return protocol.from_record(record)
    return {k: np.array(v.numpy()) for k, v in record.items()}


def metric_record(metrics: Mapping[str, float]) -> MetricRecord:
    """Aggregated metrics as Flower's MetricRecord."""
    return MetricRecord({k: float(v) for k, v in metrics.items()})


class SettingsGrid(Grid):
    """The app's Grid, adding the run's settings to every instruction it sends
    (pollen.flower.wire)."""

    def __init__(self, grid: Grid, settings: Mapping[str, Scalar]) -> None:
        self.grid = grid
        self.settings = dict(settings)

    def set_run(self, run_id: Any) -> None:
        self.grid.set_run(run_id)

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        return self.grid.get_nodes()  # type: ignore[no-any-return]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        sent = list(messages)
        for msg in sent:
            with_settings(msg.content, self.settings)
        return self.grid.push_messages(sent)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        sent = list(messages)
        for msg in sent:
            with_settings(msg.content, self.settings)
        return self.grid.send_and_receive(sent, timeout=timeout)


class Recorder(ResultsWriter):
    """The run's results files, and Flower's Result filled as the rounds come: the clients'
    aggregated metrics of each round, the server's evaluation and `evaluate_fn`'s."""

    def __init__(
        self,
        out_dir: str | Path,
        result: Result,
        global_arrays: Callable[[], dict[str, np.ndarray] | None],
        evaluate_fn: EvaluateFn | None,
    ) -> None:
        super().__init__(out_dir)
        self.result = result
        self.global_arrays = global_arrays
        self.evaluate_fn = evaluate_fn

    def write_config(self, config: Mapping[str, Any]) -> None:
        super().write_config(config)
        self._evaluate(0)  # the model the run starts from, as Flower's start does

    def round(self, row: RoundRow) -> None:
        super().round(row)
        self.result.train_metrics_clientapp[row.round] = MetricRecord(dict(row.train))
        if row.server_eval:
            self.result.evaluate_metrics_serverapp[row.round] = MetricRecord(dict(row.server_eval))
        self._evaluate(row.round)

    def _evaluate(self, rnd: int) -> None:
        arrays = self.global_arrays()
        if self.evaluate_fn is None or arrays is None:
            return
        metrics = self.evaluate_fn(rnd, to_array_record(arrays))
        if metrics is not None:
            merged = dict(self.result.evaluate_metrics_serverapp.get(rnd, MetricRecord()))
            self.result.evaluate_metrics_serverapp[rnd] = MetricRecord({**merged, **metrics})


class PollenStrategy(Strategy):
    """One of Pollen's algorithms as a Flower strategy (module docstring). `model_fn` builds
    the model the clients train (their `register(..., model_fn=...)`), in place of the
    `model` setting; `out_dir` keeps the run's results files and checkpoints (default: the
    `out-dir` setting, else results/flower-run-RUN_ID)."""

    algorithm: ClassVar[str]
    takes_model_fn: ClassVar[bool] = True
    """Its clients train the model `model_fn` builds (a classifier, pollen.flower.wire.OWN_MODEL);
    the self-supervised and ADEPT algorithms build theirs from their own settings."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.takes_model_fn = cls.algorithm in OWN_MODEL

    def __init__(
        self, *, model_fn: ModelFn | None = None, out_dir: str | None = None, **settings: Any
    ) -> None:
        if model_fn is not None and not self.takes_model_fn:
            raise SettingsError(
                f"{self.algorithm} builds its models from its own settings "
                f"({get_algorithm(self.algorithm).description}); it takes no model_fn"
            )
        given = overrides(self.algorithm, settings)
        if model_fn is not None and given.get("server-eval") is True:
            raise SettingsError(
                "server_eval=True evaluates on the dataset setting's test split with the "
                "model setting's model; with your own model, pass evaluate_fn to start()"
            )
        given.setdefault("server-eval", False)  # a Flower app evaluates with evaluate_fn
        self.overrides = given
        self.model_fn = model_fn
        self.out_dir = out_dir
        self._hooks: HookRounds | None = None

    # ---- the run's settings --------------------------------------------------------------
    def settings(self, **run: Scalar) -> dict[str, Scalar]:
        """Every setting of a run of this strategy: the keyword arguments, `run` (settings the
        run decides: num-rounds, phase-timeout, num-clients) and the defaults."""
        return resolve({"algorithm": self.algorithm, **self.overrides, **run})

    def server_half(self, settings: Mapping[str, Scalar]) -> ServerHalf:
        """The algorithm's server half (strategies/) for a run of `settings`."""
        half = strategy_class(get_algorithm(self.algorithm))(settings)
        half.model_fn = self.model_fn
        return half

    def initial_arrays(self) -> ArrayRecord:
        """The arrays a run of this strategy starts from when given none: its own seeded
        initialization (Pollen's `pollen simulate` starts from the same)."""
        half = self.server_half(self.settings())
        half.initialize(RunSettings.of(half.settings).seed)
        return to_array_record(half.global_arrays() or {})

    def summary(self) -> None:
        """Logs the algorithm and the settings given to it."""
        log.info("\t├── Pollen %s: %s", self.algorithm, get_algorithm(self.algorithm).description)
        for key, value in sorted(self.overrides.items()):
            log.info("\t│   %s = %r", key, value)

    # ---- the whole run on Pollen's engine -------------------------------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Runs `num_rounds` rounds of the algorithm on the nodes of `grid` (Pollen's round
        engine, module docstring) and returns Flower's Result: the final global arrays, the
        clients' aggregated metrics per round (`train_metrics_clientapp`; Pollen's clients
        report the received model's test metrics with their training reply), the final
        evaluation on every client (`evaluate_metrics_clientapp[num_rounds]`) and
        `evaluate_fn`'s, called with round 0's and each round's global arrays.

        `initial_arrays`: the model the run starts from (empty or None: the algorithm's own
        seeded initialization, `initial_arrays()`); FedEM takes one model as its first
        component. `timeout`: how long each phase waits for replies. `train_config` and
        `evaluate_config` must be empty: an algorithm's clients are configured by its
        settings, which travel with every instruction. The run's clients are the SuperNodes
        connected at the start (the `num_clients` keyword argument fixes their number)."""
        log.info("Starting %s strategy (Pollen's engine):", type(self).__name__)
        self.summary()
        if train_config or evaluate_config:
            raise SettingsError(
                "Pollen's clients are configured by the strategy's keyword arguments, not by "
                "train_config/evaluate_config"
            )
        settings = self._run_settings(
            grid, **{"num-rounds": num_rounds, "phase-timeout": float(timeout)}
        )
        half = self.server_half(settings)
        result = Result()
        recorder = Recorder(half.run.out_dir, result, half.global_arrays, evaluate_fn)
        start = from_array_record(initial_arrays) if initial_arrays is not None else None
        engine = Engine(SettingsGrid(grid, settings), settings, half, recorder,
                        initial_arrays=start or None)  # fmt: skip
        summary = engine.run()
        final = summary.get("final") or {}
        if final.get("eval"):
            result.evaluate_metrics_clientapp[num_rounds] = MetricRecord(dict(final["eval"]))
        arrays = half.global_arrays()
        if arrays is not None:
            result.arrays = to_array_record(arrays)
        return result

    def _run_settings(self, grid: Grid, **run: Scalar) -> dict[str, Scalar]:
        """The settings of a run on `grid`: `run`, the clients connected (`_clients`) and the
        results directory (`out_dir`, else the out-dir setting, else
        results/flower-run-RUN_ID), which also holds the clients' state (client-state/) unless
        a node's config names a state-dir."""
        run_id = getattr(getattr(grid, "run", None), "run_id", 0)
        out = self.out_dir or RunSettings.of(self.settings()).out_dir
        return self.settings(
            **run, **self._clients(grid), **{"out-dir": out or f"results/flower-run-{run_id}"}
        )

    def _clients(self, grid: Grid, wait: float = 60.0) -> dict[str, Scalar]:
        """num-clients: the keyword argument's, else the SuperNodes connected now (waiting up
        to `wait` seconds for the first)."""
        if "num-clients" in self.overrides:
            return {}
        deadline = time.monotonic() + wait
        nodes = list(grid.get_node_ids())
        while not nodes and time.monotonic() < deadline:
            time.sleep(1.0)
            nodes = list(grid.get_node_ids())
        if not nodes:
            raise SettingsError(f"no SuperNode connected within {wait:g} s")
        return {"num-clients": len(nodes)}

    # ---- Flower's hooks: one exchange at a time (pollen.flower.hooks) ---------------------
    def _rounds(self, grid: Grid | None = None) -> HookRounds:
        if self._hooks is None:
            if grid is None:
                raise RuntimeError("configure_train must come first")
            spec = get_algorithm(self.algorithm)
            if len(spec.round_phases()) != 1 or spec.once:
                raise NotImplementedError(
                    f"{self.algorithm}'s round has the phases {', '.join(spec.round_phases())}; "
                    "Flower's configure/aggregate pair is one exchange: use start()"
                )
            settings = self._run_settings(grid)
            if SecAggSettings.of(settings).enabled:
                raise NotImplementedError(
                    "secagg.enabled=true: secure aggregation runs four exchanges for each sum "
                    "(keys, shares, the masked phase, unmasking); Flower's configure/aggregate "
                    "pair is one exchange: use start()"
                )
            half = self.server_half(settings)
            self._hooks = HookRounds(half, settings, half.run.out_dir)
        return self._hooks

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The instructions of the algorithm's training exchange of `server_round` (clients
        greeted and sampled as in `start`); `arrays` (when they differ from the global model)
        replace it, as Flower's loop hands back what `aggregate_train` returned."""
        rounds = self._rounds(grid)
        given = from_array_record(arrays) if len(arrays) else None
        return rounds.configure(SettingsGrid(grid, rounds.settings), server_round, given,
                                "train")  # fmt: skip

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The replies checked and combined by the algorithm: the new global arrays and the
        clients' aggregated metrics."""
        metrics = self._rounds().aggregate(server_round, replies)
        arrays = self._rounds().half.global_arrays()
        return (None if arrays is None else to_array_record(arrays)), metric_record(metrics)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The instructions of the algorithm's evaluation of the current model on every client
        (its final evaluation, `start` runs it once after the last round)."""
        rounds = self._rounds(grid)
        return rounds.configure(SettingsGrid(grid, rounds.settings), server_round, None,
                                "evaluate")  # fmt: skip

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """The clients' evaluation metrics, weighted as the algorithm weights them."""
        return metric_record(self._rounds().aggregate(server_round, replies))


class FedAvg(PollenStrategy):
    """FedAvg (McMahan et al., 2017) with Pollen's reply checks, robust rules
    and DP: settings as keyword arguments (`keyword_settings("fedavg")`)."""

    algorithm = "fedavg"


class FedAvgPlus(PollenStrategy):
    """FedAvg with local adaptation before evaluation (FedAvg+, the FedEM paper's baseline,
    Marfoq et al., NeurIPS 2021, Sec. 5)."""

    algorithm = "fedavg-plus"


class FedProx(PollenStrategy):
    """FedProx (Li et al., MLSys 2020, Alg. 2): FedAvg with the proximal term mu/2 ||w - w^t||^2
    (`mu`)."""

    algorithm = "fedprox"


class FedEM(PollenStrategy):
    """FedEM (Marfoq et al., NeurIPS 2021, Alg. 1): M shared components (`components`), each
    client's mixture weights kept on the client; `initial_arrays` may be one model (the first
    component's start) or the packed components."""

    algorithm = "fedem"


class DFedEM(PollenStrategy):
    """D-FedEM (Marfoq et al., NeurIPS 2021, Alg. 4): FedEM without a central model, clients
    mixing with their neighbours on a random graph (`edge_probability`)."""

    algorithm = "d-fedem"


class Clustered(PollenStrategy):
    """Clustered FL (Sattler et al., 2020), FedEM's baseline: clusters split by the clients'
    update geometry (`tol1`, `tol2`)."""

    algorithm = "clustered"


class FeDLRT(PollenStrategy):
    """FeDLRT (Schotthöfer & Laiu, 2024): federated dynamical low-rank training. Its
    round has three exchanges (basis, coefficient gradients, coefficients): `start` is its
    entry point (module docstring)."""

    algorithm = "fedlrt"


class FedLin(PollenStrategy):
    """FedLin (Mitra et al., NeurIPS 2021), FeDLRT's dense baseline with variance correction;
    two exchanges per round: `start` is its entry point."""

    algorithm = "fedlin"


class FedSC(PollenStrategy):
    """FedSC (Jing et al., ICML 2024, Algorithm 1): DP-protected correlation
    matrices before each round's training; two exchanges per round: `start` is its entry
    point. Its encoder comes from its settings (`encoder`, `dim`, `hidden`)."""

    algorithm = "fedsc"


class FedAvgSC(PollenStrategy):
    """FedAvg of the spectral-contrastive loss (FedSC's baseline without correlation
    sharing)."""

    algorithm = "fedavg-sc"


class FedAvgSimCLR(PollenStrategy):
    """FedAvg of SimCLR (Chen et al., ICML 2020), FedSC's baseline."""

    algorithm = "fedavg-simclr"


class FedAvgBYOL(PollenStrategy):
    """FedAvg of BYOL (Grill et al., NeurIPS 2020), FedSC's baseline."""

    algorithm = "fedavg-byol"


class ADEPTPCA(PollenStrategy):
    """ADEPT with PCA (Ozkara et al., AISTATS 2025): the global subspace retracted onto the
    Stiefel manifold, and sigma averaging."""

    algorithm = "adept-pca"


class ADEPTAE(PollenStrategy):
    """ADEPT with autoencoders (Ozkara et al., AISTATS 2025)."""

    algorithm = "adept-ae"


class ADEPTDGM(PollenStrategy):
    """ADEPT with diffusion generative models (Ozkara et al., AISTATS 2025)."""

    algorithm = "adept-dgm"


class SCAFFOLD(PollenStrategy):
    """SCAFFOLD (Karimireddy et al., ICML 2020, Alg. 1, option II): server and client control
    variates, the clients' kept on the clients."""

    algorithm = "scaffold"


class Local(PollenStrategy):
    """Local training only: each client its own model, nothing averaged (the papers' Local
    baseline)."""

    algorithm = "local"


class NoOp(PollenStrategy):
    """A probe that trains nothing: every client answers a payload of `payload_kb`."""

    algorithm = "noop"


STRATEGIES: dict[str, type[PollenStrategy]] = {
    cls.algorithm: cls
    for cls in (
        FedAvg, FedAvgPlus, FedProx, FedEM, DFedEM, Clustered, FeDLRT, FedLin, FedSC, FedAvgSC,
        FedAvgSimCLR, FedAvgBYOL, ADEPTPCA, ADEPTAE, ADEPTDGM, SCAFFOLD, Local, NoOp,
    )
}  # fmt: skip
"""Each registered algorithm's Flower strategy, by name."""
