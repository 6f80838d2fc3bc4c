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

import io
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from threadpoolctl import threadpool_limits

from pollen.core import protocol
from pollen.core.protection import SecAggSettings
from pollen.core.registry import get_algorithm
from pollen.core.rundir import RoundRow
from pollen.core.runmodel import ModelFn
from pollen.core.settings import RunSettings, Scalar, SettingsError
from pollen.flower.hooks import HookRounds
from pollen.flower.wire import (
    OWN_MODEL,
    config_settings,
    overrides,
    resolve_for_any_count,
    run_config_kwargs,
    with_settings,
)
from server.blas import limit_blas_threads
from server.engine import Engine
from server.lifeline import watch_parent
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
    """The run's results files, and Flower's Result filled and logged as the rounds come, as
    Flower's own `Strategy.start` logs them: the clients' aggregated metrics of each round, the
    server's evaluation and `evaluate_fn`'s."""

    def __init__(
        self,
        out_dir: str | Path,
        result: Result,
        model_arrays: Callable[[], list[dict[str, np.ndarray]]],
        evaluate_fn: EvaluateFn | None,
        num_rounds: int,
    ) -> None:
        super().__init__(out_dir)
        self.result = result
        self.model_arrays = model_arrays
        self.evaluate_fn = evaluate_fn
        self.num_rounds = num_rounds

    def write_config(self, config: Mapping[str, Any]) -> None:
        super().write_config(config)
        metrics = self._evaluate(0)  # the model the run starts from, as Flower's start does
        if metrics is not None:
            log.info("Initial global evaluation results: %s", metrics)

    def round(self, row: RoundRow) -> None:
        super().round(row)
        log.info("")
        log.info("[ROUND %s/%s]", row.round, self.num_rounds)
        train = MetricRecord(dict(row.train))
        self.result.train_metrics_clientapp[row.round] = train
        log.info("\t└──> Aggregated MetricRecord: %s", train)
        if row.server_eval:
            self.result.evaluate_metrics_serverapp[row.round] = MetricRecord(dict(row.server_eval))
        metrics = self._evaluate(row.round)
        if metrics is not None:
            log.info("Global evaluation")
            log.info("\t└──> MetricRecord: %s", metrics)

    def _evaluate(self, rnd: int) -> MetricRecord | None:
        """`evaluate_fn` of round `rnd`'s global model (model_evaluation)."""
        if self.evaluate_fn is None:
            return None
        metrics = model_evaluation(self.evaluate_fn, rnd, self.model_arrays())
        if metrics is not None:
            merged = dict(self.result.evaluate_metrics_serverapp.get(rnd, MetricRecord()))
            self.result.evaluate_metrics_serverapp[rnd] = MetricRecord({**merged, **metrics})
        return metrics


def model_evaluation(
    evaluate_fn: EvaluateFn, rnd: int, models: list[dict[str, np.ndarray]]
) -> MetricRecord | None:
    """`evaluate_fn` of the global model, by the names of the model the clients train (the
    user's `model_fn`, so `Net().load_state_dict(arrays.to_torch_state_dict())` works): FeDLRT's
    as dense weights; FedEM's once per component, each metric named `comp{m}.{name}`."""
    if not models:
        return None
    if len(models) == 1:
        return evaluate_fn(rnd, to_array_record(models[0]))
    out: dict[str, Any] = {}
    for m, arrays in enumerate(models):
        metrics = evaluate_fn(rnd, to_array_record(arrays))
        out.update({f"comp{m}.{k}": v for k, v in (metrics or {}).items()})
    return MetricRecord(out) if out else None


def components(arrays: ArrayRecord) -> list[ArrayRecord]:
    """FedEM's `Result.arrays` (its components, `comp{m}.{name}`) as one ArrayRecord per
    component, each loadable into the model: `Net().load_state_dict(c.to_torch_state_dict())`.
    Arrays of one model come back as a list of one."""
    parts: dict[int, dict[str, Array]] = {}
    for key, value in arrays.items():
        head, dot, rest = key.partition(".")
        if not (dot and head.startswith("comp") and head[4:].isdigit()):
            return [arrays]
        parts.setdefault(int(head[4:]), {})[rest] = value
    return [ArrayRecord(parts[m]) for m in sorted(parts)]


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

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], **kwargs: Any) -> PollenStrategy:
        """The strategy with the settings a Flower run config names (`context.run_config`: a
        key `local-epochs` or `local_epochs` is the keyword argument local_epochs, `lr` is lr),
        then `kwargs` (`model_fn=Net`, or settings that override the run config's). Keys that
        name no setting (the app's own, such as `num-server-rounds`) are logged and left out."""
        given, ignored = run_config_kwargs(cls.algorithm, run_config)
        for key, note in ignored.items():
            log.info("run config %r: no setting of %s, not passed to it%s", key, cls.algorithm,
                     note)  # fmt: skip
        return cls(**{**given, **kwargs})

    # ---- the run's settings --------------------------------------------------------------
    def settings(self, **run: Scalar) -> dict[str, Scalar]:
        """Every setting of a run of this strategy: the keyword arguments, `run` (settings the
        run decides: num-rounds, phase-timeout, num-clients) and the defaults."""
        return resolve_for_any_count({"algorithm": self.algorithm, **self.overrides, **run})

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
        `evaluate_fn`'s, called with round 0's and each round's global model by the names of
        the model the clients train (FeDLRT's dense weights; FedEM's once per component, its
        metrics named `comp{m}.{name}`).

        `initial_arrays`: the model the run starts from (empty or None: the algorithm's own
        seeded initialization, `initial_arrays()`); FedEM takes one model as its first
        component. `timeout`: how long each phase waits for replies. `train_config`: settings
        for this run (`ConfigRecord({"lr": 0.01})`: each key a keyword argument or a setting,
        `config_settings`); `evaluate_config` must be empty. The settings travel with every
        instruction. The run's clients are the SuperNodes
        connected at the start (the `num_clients` keyword argument fixes their number)."""
        log.info("Starting %s strategy (Pollen's engine):", type(self).__name__)
        watch_parent()  # a ServerApp whose SuperLink is gone exits (server.lifeline)
        self.summary()
        if evaluate_config:
            raise SettingsError(
                "evaluate_config: Pollen's clients evaluate as the strategy's settings say; "
                "give them as keyword arguments"
            )
        given = config_settings(self.algorithm, dict(train_config or {}))
        settings = self._run_settings(
            grid, **given, **{"num-rounds": num_rounds, "phase-timeout": float(timeout)}
        )
        started = time.time()
        half = self.server_half(settings)
        result = Result()
        recorder = Recorder(half.run.out_dir, result, half.model_arrays, evaluate_fn, num_rounds)
        start = from_array_record(initial_arrays) if initial_arrays is not None else None
        engine = Engine(SettingsGrid(grid, settings), settings, half, recorder,
                        initial_arrays=start or None)  # fmt: skip
        threads = RunSettings.of(settings).server_blas_threads
        # the server's linear algebra is small (FeDLRT's SVDs): a multi-threaded BLAS only
        # spins against the clients and the SuperLink on a shared machine (server.blas)
        with threadpool_limits(limits=threads or None, user_api="blas"):
            summary = engine.run()
        final = summary.get("final") or {}
        if final.get("eval"):
            result.evaluate_metrics_clientapp[num_rounds] = MetricRecord(dict(final["eval"]))
        models = half.model_arrays()
        arrays = models[0] if len(models) == 1 else half.global_arrays()
        if arrays is not None:
            result.arrays = to_array_record(arrays)
        log.info("")
        log.info("Strategy execution finished in %.2fs", time.time() - started)
        log.info("")
        log.info("Final results:")
        log.info("")
        for line in io.StringIO(str(result)):
            log.info("\t%s", line.strip("\n"))
        log.info("")
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
            limit_blas_threads(RunSettings.of(settings).server_blas_threads)  # server.blas
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
