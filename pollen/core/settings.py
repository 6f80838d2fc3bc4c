"""Run settings: what a setting is (key, type, default, range), settings groups (declared once
as frozen dataclasses, read typed) and the settings every run has, whatever its algorithm
(RunSettings, SyntheticSettings; the protections' groups are pollen.core.protection's). Each
algorithm declares its own group in its contract module and names it in its registry entry;
pollen.core.runconfig resolves and checks a run's settings against all of them.

Flower only accepts run-config keys that `pyproject.toml` declares, so every key is mirrored
there; `tests/pollen/test_settings.py` keeps the two identical.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

Scalar = int | float | str | bool


class SettingsError(ValueError):
    """A run setting is unknown, of the wrong type or out of range."""


@dataclass(frozen=True)
class Setting:
    key: str
    default: Scalar
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None

    @property
    def kind(self) -> type:
        return type(self.default)

    def coerce(self, value: Any) -> Scalar:
        """Convert a raw value (CLI text, TOML, JSON) to this setting's type and check it."""
        kind = self.kind
        try:
            if kind is bool:
                if isinstance(value, bool):
                    out: Scalar = value
                elif isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
                    out = True
                elif isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
                    out = False
                elif isinstance(value, int) and value in (0, 1):
                    out = bool(value)
                else:
                    raise ValueError
            elif kind is int:
                if isinstance(value, bool):
                    raise ValueError
                if isinstance(value, float):
                    if not value.is_integer():
                        raise ValueError
                    out = int(value)
                else:
                    out = int(value)
            elif kind is float:
                if isinstance(value, bool):
                    raise ValueError
                out = float(value)
                if out != out or out in (float("inf"), float("-inf")):
                    raise ValueError
            else:
                out = str(value)
        except (TypeError, ValueError):
            raise SettingsError(
                f"setting '{self.key}': expected {kind.__name__}, got {value!r}"
            ) from None
        if self.choices is not None and out not in self.choices:
            raise SettingsError(
                f"setting '{self.key}': {out!r} is not one of {', '.join(self.choices)}"
            )
        if isinstance(out, int | float) and not isinstance(out, bool):
            if self.minimum is not None and out < self.minimum:
                raise SettingsError(
                    f"setting '{self.key}': {out} is below the minimum {self.minimum}"
                )
            if self.maximum is not None and out > self.maximum:
                raise SettingsError(
                    f"setting '{self.key}': {out} is above the maximum {self.maximum}"
                )
        return out


def setting(
    default: Scalar,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
) -> Any:
    """A field of a SettingsGroup: its default, its help line and its allowed values."""
    return field(
        default=default,
        metadata={"help": help, "choices": choices, "minimum": minimum, "maximum": maximum},
    )


G = TypeVar("G", bound="SettingsGroup")


@dataclass(frozen=True)
class SettingsGroup:
    """Settings that share a key prefix, declared once as the fields of a frozen dataclass and
    read typed: field `em_iterations` of a group whose PREFIX is "fedem" is the setting
    `fedem.em-iterations`. `declarations()` gives the catalogue entries (`pollen settings`,
    pyproject.toml, validation); `of(settings)` builds the typed view of a resolved run's
    settings, checking each value once."""

    PREFIX: ClassVar[str] = ""

    @classmethod
    def key(cls, name: str) -> str:
        """The setting's key of field `name`."""
        base = name.replace("_", "-")
        return f"{cls.PREFIX}.{base}" if cls.PREFIX else base

    @classmethod
    def declarations(cls) -> tuple[Setting, ...]:
        kept = _DECLARATIONS.get(cls)
        if kept is None:
            kept = _DECLARATIONS[cls] = cls._declare()
        return kept

    @classmethod
    def _declare(cls) -> tuple[Setting, ...]:
        return tuple(
            Setting(
                cls.key(f.name),
                f.default,  # type: ignore[arg-type]  # every field has a scalar default
                f.metadata["help"],
                choices=f.metadata["choices"],
                minimum=f.metadata["minimum"],
                maximum=f.metadata["maximum"],
            )
            for f in fields(cls)
        )

    @classmethod
    def of(cls: type[G], settings: Mapping[str, Scalar]) -> G:
        """The typed view of `settings`: each value coerced and checked like CLI input; a key
        the mapping lacks takes its default. Views are immutable and kept by the settings'
        contents (values with their types: 1, 1.0 and True check differently), so that code
        reading a setting per message or per client checks the run's settings once."""
        contents = settings_key(settings)
        key = None if contents is None else (cls, contents)

        def check() -> SettingsGroup:
            values = {
                f.name: decl.coerce(settings[decl.key]) if decl.key in settings else decl.default
                for f, decl in zip(fields(cls), cls.declarations(), strict=True)
            }
            return cls(**values)

        return kept(_VIEWS, key, check)  # type: ignore[return-value]  # kept under its class


class SettingsKey:
    """A hashable key of a settings mapping's contents (`settings_key`), its hash computed
    once: a run's key is looked up with every typed read of its settings."""

    __slots__ = ("_hash", "contents")

    def __init__(self, contents: tuple[tuple[tuple[str, Scalar], ...], tuple[type, ...]]) -> None:
        self.contents = contents
        self._hash = hash(contents)  # TypeError: a value is not hashable

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, SettingsKey)
            and self._hash == other._hash
            and self.contents == other.contents
        )


class FrozenSettings(dict[str, Scalar]):
    """A run's resolved settings that nobody changes (a running app's, read per message), with
    their `settings_key` computed once."""

    __slots__ = ("key",)

    def __init__(self, settings: Mapping[str, Scalar]) -> None:
        super().__init__(settings)
        self.key = _contents_key(self)

    def _frozen(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a running app's settings do not change")

    __setitem__ = __delitem__ = __ior__ = _frozen  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _frozen  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type[FrozenSettings], tuple[dict[str, Scalar]]]:
        return FrozenSettings, (dict(self),)


def settings_key(settings: Mapping[str, Scalar]) -> SettingsKey | None:
    """A hashable key of the settings' contents, their values' types included (1, 1.0 and
    True check differently); None when a value is not hashable."""
    if type(settings) is FrozenSettings:
        return settings.key
    return _contents_key(settings)


def _contents_key(settings: Mapping[str, Scalar]) -> SettingsKey | None:
    try:
        key = SettingsKey((tuple(settings.items()), tuple(map(type, settings.values()))))
    except TypeError:
        return None
    # one key object per contents: a lookup under it then compares by identity
    return kept(_KEYS, key, lambda: key)


MOST_VIEWS = 256
"""Entries a process keeps in each cache of `kept` (a run needs one typed view per group;
tests and tools make more)."""

K = TypeVar("K")
V = TypeVar("V")


def kept(cache: dict[K, V], key: K | None, make: Callable[[], V]) -> V:
    """`cache[key]`, made by `make` the first time: a per-process cache of what a run's
    settings determine, emptied when it holds MOST_VIEWS entries; a key of None (settings
    that are not hashable) is made every time and never kept."""
    if key is None:
        return make()
    found = cache.get(key)
    if found is None:
        if len(cache) >= MOST_VIEWS:
            cache.clear()
        found = cache[key] = make()
    return found

_VIEWS: dict[tuple[type, SettingsKey], SettingsGroup] = {}
_KEYS: dict[SettingsKey, SettingsKey] = {}
_DECLARATIONS: dict[type, tuple[Setting, ...]] = {}


@dataclass(frozen=True)
class RunSettings(SettingsGroup):
    """The settings every run has, whatever its algorithm: `RunSettings.of(settings)`."""

    # what to run
    algorithm: str = setting("fedavg", "algorithm to run (see `pollen algorithms`)")
    dataset: str = setting("mnist-5k", "dataset name (see `pollen datasets`)")
    model: str = setting(
        "mlp",
        "model architecture",
        choices=(
            "mlp",
            "cnn",
            "linear",
            "femnist-cnn",
            "mobilenet-v2",
            "char-lstm",
            "char-lstm-small",
            "resnet18-cifar",
        ),
    )
    num_rounds: int = setting(3, "number of server rounds", minimum=1)
    num_clients: int = setting(3, "number of data partitions (one per client)", minimum=1)
    seed: int = setting(
        0, "seed of partitions, model initialisation, sampling and client RNGs", minimum=0
    )
    # data
    partitioner: str = setting(
        "iid",
        "how data is split over clients",
        choices=("iid", "dirichlet", "classes", "label-groups", "pachinko", "one-class", "natural"),
    )
    dirichlet_alpha: float = setting(
        0.5, "concentration of the Dirichlet partitioners", minimum=1e-06
    )
    classes_per_client: int = setting(2, "labels per client ('classes', 'one-class')", minimum=1)
    label_groups: int = setting(
        3, "label groups of the 'label-groups' split (-1: one per label)", minimum=-1
    )
    pachinko_beta: float = setting(
        10.0, "fine-label concentration of the 'pachinko' split", minimum=1e-06
    )
    val_fraction: float = setting(
        0.1, "share of each client's data kept for validation", minimum=0.0, maximum=0.9
    )
    test_fraction: float = setting(
        0.2, "share of each client's data kept for testing", minimum=0.0, maximum=0.9
    )
    pool_test: bool = setting(
        False,
        "partition the dataset's official test set together with its training set (FedEM's "
        "CIFAR-10: all 60,000 images); the server then evaluates on the clients' test splits",
    )
    subsample: float = setting(
        1.0,
        "share of the (pooled) examples kept, drawn at random with the seed before partitioning "
        "(FedEM's s_frac; ADEPT's ~10% of MNIST per client)",
        minimum=1e-06,
        maximum=1.0,
    )
    data_dir: str = setting(
        "", "directory holding torchvision datasets and LEAF's shakespeare/ and femnist/"
    )
    download: bool = setting(False, "let torchvision download a missing dataset")
    cache_dir: str = setting("", "partition cache (default: $POLLEN_CACHE_DIR or ~/.cache/pollen)")
    # local training
    lr: float = setting(0.05, "client learning rate", minimum=0.0)
    momentum: float = setting(0.0, "client SGD momentum", minimum=0.0, maximum=1.0)
    weight_decay: float = setting(0.0, "client L2 weight decay", minimum=0.0)
    local_epochs: int = setting(1, "local epochs per round", minimum=1)
    local_steps: int = setting(
        0,
        "local SGD steps (mini-batches) per round in place of local-epochs, passes over the data "
        "reshuffled as each ends (FeDLRT's s* local iterations); 0: count in local-epochs",
        minimum=0,
    )
    batch_size: int = setting(32, "client mini-batch size", minimum=1)
    drop_last: bool = setting(
        False,
        "skip each epoch's last, incomplete mini-batch when a client holds more than one batch "
        "(FedEM's reference code for its BatchNorm MobileNet-v2); classifier training only",
    )
    random_flip: bool = setting(
        False,
        "mirror each training image left-right with probability 1/2 at every step (FeDLRT's "
        "CIFAR-10 training); classifier training only",
    )
    class_weights: str = setting(
        "dataset",
        "per-class loss weights: 'dataset' uses the dataset's reference weights when it has them "
        "(shakespeare: FedEM's character weights), 'none' weighs every class 1",
        choices=("dataset", "none"),
    )
    persist_momentum: bool = setting(
        False,
        "keep each client's SGD momentum buffers between rounds (as the reference codes of FedEM "
        "and its baselines do); stored in the client state",
    )
    lr_schedule: str = setting(
        "constant",
        "'multistep' multiplies lr by 0.1 at round num-rounds//2 and again at 3*(num-rounds//4); "
        "'late-drop' multiplies it by 0.1 once, at round 3*num-rounds//4; "
        "'cosine' anneals it to lr-min over the rounds, lr-min + (lr - lr-min)(1 + cos(pi "
        "(t-1)/num-rounds))/2",
        choices=("constant", "multistep", "late-drop", "cosine"),
    )
    lr_min: float = setting(0.0, "the learning rate 'cosine' anneals to", minimum=0.0)
    # orchestration
    fraction_train: float = setting(
        1.0, "fraction of available clients sampled each round", minimum=0.0, maximum=1.0
    )
    min_train_clients: int = setting(1, "clients sampled at least per round", minimum=1)
    min_replies: int = setting(1, "valid replies a phase needs, else the run stops", minimum=1)
    min_available_clients: int = setting(
        1, "clients that must be connected before round 1", minimum=1
    )
    wait_for_clients: float = setting(
        300.0, "seconds to wait for min-available-clients", minimum=0.0
    )
    phase_timeout: float = setting(
        600.0, "seconds a phase waits for replies (stragglers are dropped)", minimum=0.1
    )
    resend_limit: int = setting(
        2,
        "times an unanswered instruction that is safe to repeat (the hello, and every phase "
        "whose reply the client recomputes from its stored state) is sent again within its "
        "phase, each after a deadline that grows with how long the phase's other replies took; "
        "0: never",
        minimum=0,
        maximum=10,
    )
    poll_interval: float = setting(
        1.0,
        "longest wait between reply polls (polling starts at 5 ms and backs off); "
        "pollen simulate uses 0.05 unless given",
        minimum=0.01,
        maximum=30.0,
    )
    simulation_nodes: int = setting(
        0,
        "simulation: the simulated SuperNodes the clients are packed onto, each hosting a "
        "contiguous block of client ids, one message per node and phase (`pollen simulate "
        "--nodes` sets it); 0: one SuperNode per client",
        minimum=0,
    )
    client_timing: bool = setting(
        False,
        "clients add time-* metrics (process start-up, data load, handler) and peak-rss-mb to "
        "each reply (benchmarks)",
    )
    server_blas_threads: int = setting(
        1,
        "threads of NumPy's BLAS in the server process (0: the library's default); more only help "
        "large models on a server machine of its own",
        minimum=0,
    )
    max_examples: int = setting(100000000, "largest example count a reply may claim", minimum=1)
    max_reply_mb: float = setting(2048.0, "largest reply payload accepted, in MB", minimum=0.001)
    unseen_fraction: float = setting(
        0.0,
        "share of clients (the highest ids) that never train; the final evaluation serves them "
        "the trained model(s) and reports them apart as unseen-*",
        minimum=0.0,
        maximum=0.9,
    )
    server_eval: bool = setting(True, "evaluate the global model on the server each round")
    final_eval: bool = setting(
        True, "evaluate the final model on every client after the last round"
    )
    # results and state
    out_dir: str = setting("", "results directory (written by the server)")
    run_name: str = setting("", "stable name of the run; client state is kept under it")
    resume: bool = setting(False, "continue the run in out-dir from its last checkpoint")
    client_state_dir: str = setting("", "client state directory when a node gives none")
    device: str = setting(
        "auto",
        "client device ('auto': CUDA when torch sees a GPU)",
        choices=("auto", "cpu", "cuda"),
    )
    amp: bool = setting(
        False,
        "mixed precision in the shared local training loops (autocast: bfloat16, or float16 with "
        "loss scaling on GPUs without bfloat16; bfloat16 on CPU); algorithms whose math must stay "
        "float32 refuse it (docs/deployment.md#gpu)",
    )

    @property
    def training_clients(self) -> int:
        """N: the clients that train, all but the held-out unseen ones (the last
        floor(unseen-fraction x num-clients) ids)."""
        return self.num_clients - math.floor(self.unseen_fraction * self.num_clients)


@dataclass(frozen=True)
class SyntheticSettings(SettingsGroup):
    """The generated datasets' settings: FedEM's (dataset=fedem-synthetic, partitioner=natural),
    ADEPT-PCA's (dataset=pca-synthetic, partitioner=natural; it reads dimension, noise as
    sigma_eps, seed, train-size, test-size, rank and heterogeneity) and ADEPT-AE's
    (dataset=ae-synthetic, partitioner=natural; the same settings, rank being the decoders'
    latent size and heterogeneity the std of their perturbation)."""

    PREFIX: ClassVar[str] = "synthetic"

    # FedEM's synthetic dataset (dataset=fedem-synthetic, partitioner=natural)
    dimension: int = setting(150, "feature dimension d", minimum=1)
    components: int = setting(3, "true mixture components", minimum=1)
    alpha: float = setting(0.4, "Dirichlet concentration of clients' mixtures", minimum=1e-06)
    noise: float = setting(0.1, "label noise standard deviation", minimum=0.0)
    test_size: int = setting(1000, "test examples per client (paper: 5000)", minimum=1)
    seed: int = setting(1234, "seed of the generated data (paper: 1234)", minimum=0)
    mode: str = setting(
        "reference",
        "'reference' reproduces the paper's generator (bugs included); 'clean' fixes it; "
        "'bernoulli' draws labels as the paper's text says",
        choices=("reference", "clean", "bernoulli"),
    )
    train_size: int = setting(
        0,
        "fixed training examples per client (0: fedem-synthetic's lognormal draw, pca-synthetic's "
        "20, ae-synthetic's 10)",
        minimum=0,
    )
    # ADEPT-PCA's and ADEPT-AE's synthetic datasets (dataset=pca-synthetic or ae-synthetic,
    # partitioner=natural); they also read synthetic.dimension, noise (sigma_eps; ae-synthetic:
    # additive noise), seed, train-size and test-size
    rank: int = setting(
        20,
        "rank r of the clients' principal subspaces (ae-synthetic: latent size of their decoders)",
        minimum=1,
    )
    heterogeneity: float = setting(
        0.1,
        "std of the perturbation scattering the clients' subspaces (ae-synthetic: decoders) "
        "around the shared one",
        minimum=0.0,
    )


def toml_value(value: Scalar) -> str:
    """A setting's value as TOML (for pyproject.toml and Flower's --run-config files)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """`key=value` strings from the command line."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out
