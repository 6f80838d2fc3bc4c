"""Run settings: what a setting is (key, type, default, range) and the settings every run has,
whatever its algorithm. Each algorithm declares its own in its registry entry; pollen.registry
resolves and checks a run's settings against all of them.

Flower only accepts run-config keys that `pyproject.toml` declares, so every key is mirrored
there; `tests/pollen/test_settings.py` keeps the two identical.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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


COMMON_SETTINGS: tuple[Setting, ...] = (
    # what to run
    Setting("algorithm", "fedavg", "algorithm to run (see `pollen algorithms`)"),
    Setting("dataset", "mnist-5k", "dataset name (see `pollen datasets`)"),
    Setting(
        "model",
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
    ),
    Setting("num-rounds", 3, "number of server rounds", minimum=1),
    Setting("num-clients", 3, "number of data partitions (one per client)", minimum=1),
    Setting(
        "seed", 0, "seed of partitions, model initialisation, sampling and client RNGs", minimum=0
    ),
    # data
    Setting(
        "partitioner",
        "iid",
        "how data is split over clients",
        choices=("iid", "dirichlet", "classes", "label-groups", "pachinko", "one-class", "natural"),
    ),
    Setting("dirichlet-alpha", 0.5, "concentration of the Dirichlet partitioners", minimum=1e-6),
    Setting("classes-per-client", 2, "labels per client ('classes', 'one-class')", minimum=1),
    Setting(
        "label-groups",
        3,
        "label groups of the 'label-groups' split (-1: one per label)",
        minimum=-1,
    ),
    Setting(
        "pachinko-beta", 10.0, "fine-label concentration of the 'pachinko' split", minimum=1e-6
    ),
    Setting(
        "val-fraction",
        0.1,
        "share of each client's data kept for validation",
        minimum=0.0,
        maximum=0.9,
    ),
    Setting(
        "test-fraction",
        0.2,
        "share of each client's data kept for testing",
        minimum=0.0,
        maximum=0.9,
    ),
    Setting("data-dir", "", "directory holding torchvision datasets and LEAF's shakespeare/"),
    Setting("download", False, "let torchvision download a missing dataset"),
    Setting("cache-dir", "", "partition cache (default: $POLLEN_CACHE_DIR or ~/.cache/pollen)"),
    # FedEM's synthetic dataset (dataset=fedem-synthetic, partitioner=natural)
    Setting("synthetic.dimension", 150, "feature dimension d", minimum=1),
    Setting("synthetic.components", 3, "true mixture components", minimum=1),
    Setting("synthetic.alpha", 0.4, "Dirichlet concentration of clients' mixtures", minimum=1e-6),
    Setting("synthetic.noise", 0.1, "label noise standard deviation", minimum=0.0),
    Setting("synthetic.test-size", 1000, "test examples per client (paper: 5000)", minimum=1),
    Setting("synthetic.seed", 1234, "seed of the generated data (paper: 1234)", minimum=0),
    Setting(
        "synthetic.mode",
        "reference",
        "'reference' reproduces the paper's generator (bugs included); 'clean' fixes it; "
        "'bernoulli' draws labels as the paper's text says",
        choices=("reference", "clean", "bernoulli"),
    ),
    Setting(
        "synthetic.train-size",
        0,
        "fixed training examples per client (0: fedem-synthetic's lognormal draw, "
        "pca-synthetic's 20)",
        minimum=0,
    ),
    # ADEPT-PCA's synthetic dataset (dataset=pca-synthetic, partitioner=natural); it also
    # reads synthetic.dimension, noise (sigma_eps), seed, train-size and test-size
    Setting("synthetic.rank", 20, "rank r of the clients' principal subspaces", minimum=1),
    Setting(
        "synthetic.heterogeneity",
        0.1,
        "std of the perturbation scattering the clients' subspaces around the shared one",
        minimum=0.0,
    ),
    # local training
    Setting("lr", 0.05, "client learning rate", minimum=0.0),
    Setting("momentum", 0.0, "client SGD momentum", minimum=0.0, maximum=1.0),
    Setting("weight-decay", 0.0, "client L2 weight decay", minimum=0.0),
    Setting("local-epochs", 1, "local epochs per round", minimum=1),
    Setting("batch-size", 32, "client mini-batch size", minimum=1),
    Setting(
        "class-weights",
        "dataset",
        "per-class loss weights: 'dataset' uses the dataset's reference weights when it has "
        "them (shakespeare: FedEM's character weights), 'none' weighs every class 1",
        choices=("dataset", "none"),
    ),
    Setting(
        "persist-momentum",
        False,
        "keep each client's SGD momentum buffers between rounds (as the reference codes of "
        "FedEM and its baselines do); stored in the client state",
    ),
    Setting(
        "lr-schedule",
        "constant",
        "'multistep' multiplies lr by 0.1 at round num-rounds//2 and again at 3*(num-rounds//4); "
        "'cosine' anneals it to lr-min over the rounds, "
        "lr-min + (lr - lr-min)(1 + cos(pi (t-1)/num-rounds))/2",
        choices=("constant", "multistep", "cosine"),
    ),
    Setting("lr-min", 0.0, "the learning rate 'cosine' anneals to", minimum=0.0),
    # orchestration
    Setting(
        "fraction-train",
        1.0,
        "fraction of available clients sampled each round",
        minimum=0.0,
        maximum=1.0,
    ),
    Setting("min-train-clients", 1, "clients sampled at least per round", minimum=1),
    Setting("min-replies", 1, "valid replies a phase needs, else the run stops", minimum=1),
    Setting("min-available-clients", 1, "clients that must be connected before round 1", minimum=1),
    Setting("wait-for-clients", 300.0, "seconds to wait for min-available-clients", minimum=0.0),
    Setting(
        "phase-timeout",
        600.0,
        "seconds a phase waits for replies (stragglers are dropped)",
        minimum=0.1,
    ),
    Setting(
        "poll-interval",
        1.0,
        "longest wait between reply polls (polling starts at 5 ms and backs off)",
        minimum=0.01,
        maximum=30.0,
    ),
    Setting(
        "client-timing",
        False,
        "clients add time-* metrics (process start-up, data load, handler) and peak-rss-mb "
        "to each reply (benchmarks)",
    ),
    Setting(
        "server-blas-threads",
        1,
        "threads of NumPy's BLAS in the server process (0: the library's default); more only "
        "help large models on a server machine of its own",
        minimum=0,
    ),
    Setting("max-examples", 100_000_000, "largest example count a reply may claim", minimum=1),
    Setting("max-reply-mb", 2048.0, "largest reply payload accepted, in MB", minimum=0.001),
    Setting(
        "unseen-fraction",
        0.0,
        "share of clients (the highest ids) that never train; the final evaluation serves them "
        "the trained model(s) and reports them apart as unseen-*",
        minimum=0.0,
        maximum=0.9,
    ),
    Setting("server-eval", True, "evaluate the global model on the server each round"),
    Setting("final-eval", True, "evaluate the final model on every client after the last round"),
    # results and state
    Setting("out-dir", "", "results directory (written by the server)"),
    Setting("run-name", "", "stable name of the run; client state is kept under it"),
    Setting("resume", False, "continue the run in out-dir from its last checkpoint"),
    Setting("client-state-dir", "", "client state directory when a node gives none"),
    Setting("device", "auto", "client device", choices=("auto", "cpu", "cuda")),
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
