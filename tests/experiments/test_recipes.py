"""The paper-scale recipes start and run: every method of each recipe file passes the checks
`pollen simulate` makes before it starts (settings, data, model) on a tiny stand-in of its data
in the real on-disk format (tests.standins), and the methods a recipe lists in `run` (one per
client code path; for the costly FedSC encoder, FedSC itself) run two rounds and the final
evaluation in-process (the real ClientApp behind a FakeGrid), reporting the recipe's first
metric. Only the rounds, the client count and sizes (data, and ADEPT-DGM's sampling) are
overridden; models and every other setting are the file's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from client.app import app as client_app
from pollen.core.registry import get_algorithm
from pollen.core.rundir import Summary, read_jsonl
from pollen.core.settings import RunSettings, toml_value
from pollen.tools.cli.parser import build_parser
from pollen.tools.cli.resolve import resolve_run_settings
from pollen.tools.experiment import Experiment, final_value, method_settings
from server.engine import Engine
from server.results import ResultsWriter
from strategies.base import strategy_class
from tests.fakes import FakeClock, FakeGrid
from tests.standins import skip_md5_checks, write_standin

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
ROUNDS = 2


@dataclass(frozen=True)
class Recipe:
    file: str
    dataset: str
    clients: int
    run: tuple[str, ...]
    """Methods that run two rounds; the others pass the preflight checks only."""
    standin: Mapping[str, int] = field(default_factory=dict)
    sizes: Mapping[str, Any] = field(default_factory=dict)


FEDEM_RUN = ("fedem", "fedavg-plus", "clustered", "local")  # FedAvg, FedProx: FedAvg+'s client
RECIPES = (
    Recipe("fedem_cifar10.toml", "cifar10", 2, FEDEM_RUN,
           {"train_per_class": 3, "test_per_class": 1}),
    Recipe("fedem_femnist.toml", "femnist", 3, FEDEM_RUN,
           {"train_per_class": 6, "test_per_class": 2, "clients": 4}),
    Recipe("fedem_shakespeare.toml", "shakespeare", 3, FEDEM_RUN, {"clients": 4}),
    # the warm start and all three phases (FedLin: the same handlers; the others: subsets)
    Recipe("fedlrt_cifar10.toml", "cifar10", 2, ("fedlrt-full",),
           {"train_per_class": 2, "test_per_class": 1}),
    Recipe("fedsc_cifar10.toml", "cifar10", 2, ("fedsc",),
           {"train_per_class": 2, "test_per_class": 1}),
    Recipe("fedsc_svhn.toml", "svhn", 2, ("fedsc",),
           {"train_per_class": 1, "test_per_class": 1}),
    Recipe("adept_ae_mnist_table2.toml", "mnist", 10,
           ("adept-low", "fedavg-low", "local-low"),
           {"train_per_class": 12, "test_per_class": 4}),
    Recipe("adept_ae_fmnist_table2.toml", "fashion-mnist", 10, ("adept-high",),
           {"train_per_class": 12, "test_per_class": 4}),
    # 50 per class: the Baseline keeps 1% of a client's images for testing, one at least
    Recipe("adept_ae_cifar10_table2.toml", "cifar10", 10, ("adept-high", "baseline-low"),
           {"train_per_class": 50, "test_per_class": 8}),
    Recipe("adept_dgm_mnist_table3.toml", "mnist", 10, ("adept-high", "fedavg-ft-low"),
           {"train_per_class": 8, "test_per_class": 4},
           {"adept-dgm.samples": 4, "adept-dgm.sample-steps": 3, "adept-dgm.kid-subsets": 2,
            "adept-dgm.feature-epochs": 1}),
)  # fmt: skip


def _settings(
    exp: Experiment, method: str, recipe: Recipe, data: Path, out: Path
) -> dict[str, Any]:
    """The method's settings as `pollen experiment` passes them to `pollen simulate`, with the
    test's overrides, resolved by the CLI's own preflight (which loads the data and builds the
    model)."""
    cfg = exp.methods[method]
    values = method_settings(exp, cfg, exp.seeds[0])
    values.update(recipe.sizes)
    values.update({"num-rounds": ROUNDS, "data-dir": str(data), "device": "cpu",
                   "cache-dir": str(data / "cache"), "phase-timeout": 60.0,
                   "poll-interval": 0.05, "wait-for-clients": 5.0})  # fmt: skip
    if "num-clients" not in cfg:  # a method's own count (a centralised bound, ...) stays
        values["num-clients"] = recipe.clients
    argv = ["simulate", "--out", str(out)]
    for key, value in values.items():
        argv += ["--set", f"{key}={value if isinstance(value, str) else toml_value(value)}"]
    return resolve_run_settings(build_parser().parse_args(argv))


def _run(settings: dict[str, Any]) -> dict[str, Any]:
    run = RunSettings.of(settings)
    strategy = strategy_class(get_algorithm(run.algorithm))(settings)
    grid = FakeGrid(client_app, run.num_clients, settings)
    clock = FakeClock()
    engine = Engine(grid, settings, strategy, ResultsWriter(run.out_dir), clock=clock,
                    sleep=clock.sleep)  # fmt: skip
    return engine.run()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=[r.file.removesuffix(".toml") for r in RECIPES])
def test_recipe_runs_two_rounds_on_a_stand_in(
    recipe: Recipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_md5_checks(monkeypatch)
    exp = Experiment.load(EXPERIMENTS / recipe.file)
    assert set(recipe.run) <= set(exp.methods)
    data = write_standin(recipe.dataset, tmp_path / "data", **recipe.standin)
    for method in exp.methods:
        settings = _settings(exp, method, recipe, data, tmp_path / method)
        assert settings["dataset"] == recipe.dataset and settings["num-rounds"] == ROUNDS
        if method not in recipe.run:
            continue
        summary = _run(settings)
        assert summary["status"] == "completed", (method, summary)
        rows = read_jsonl(tmp_path / method / "metrics.jsonl")
        assert [row["round"] for row in rows] == [1, 2], method
        primary = exp.metrics[0]
        value = final_value(Summary.from_json(summary), primary)
        assert value is not None and value == value, (method, primary, summary["final"])


# The papers' settings each recipe must keep (resolved for the named method): a guard against a
# recipe drifting from its paper while it still runs.
PAPER_SETTINGS: dict[tuple[str, str], dict[str, Any]] = {
    ("fedem_cifar10.toml", "fedem"): {
        "model": "mobilenet-v2", "drop-last": True, "pool-test": True, "num-clients": 80,
        "partitioner": "label-groups", "label-groups": 3, "dirichlet-alpha": 0.4,
        "batch-size": 128, "num-rounds": 200, "lr": 0.1, "fedem.components": 3,
        "lr-schedule": "multistep", "test-fraction": 0.2, "val-fraction": 0.0,
    },
    ("fedem_femnist.toml", "fedem"): {
        "dataset": "femnist", "model": "femnist-cnn", "num-clients": 539, "batch-size": 128,
        "num-rounds": 200, "lr": 0.1, "drop-last": False,
    },
    ("fedem_shakespeare.toml", "fedem"): {
        "model": "char-lstm", "num-clients": 778, "num-rounds": 80, "batch-size": 128,
    },
    ("fedlrt_cifar10.toml", "fedlrt-full"): {
        "model": "resnet18-cifar", "batch-size": 128, "lr": 1e-3, "lr-min": 5e-4,
        "lr-schedule": "cosine", "momentum": 0.9, "weight-decay": 1e-3, "fedlrt.tau": 0.01,
        "num-rounds": 200, "fedlrt.warm-start": 5, "random-flip": True, "test-fraction": 0.0,
        "local-steps": 30,
    },
    ("fedsc_cifar10.toml", "fedsc"): {
        "fedsc.encoder": "fixup-resnet20", "fedsc.dim": 512, "fedsc.hidden": 1024,
        "batch-size": 512, "local-epochs": 5, "num-rounds": 200, "fedsc.mu": 4.0,
        "fedsc.passes": 5, "fedsc.views-per-pass": 2, "num-clients": 10,
        "classes-per-client": 1, "fedsc.probe-epochs": 200,
    },
    ("fedsc_cifar10.toml", "fedsc-eps6"): {
        "fedsc.noise-std": 0.0052, "fedsc.share": "after-even", "fedsc.share-after": 100,
    },
    ("fedsc_svhn.toml", "fedsc"): {
        "fedsc.encoder": "fixup-resnet20", "fedsc.mu": 2.0, "num-clients": 5,
        "classes-per-client": 2, "batch-size": 512,
    },
    ("adept_ae_mnist_table2.toml", "adept-low"): {
        "num-clients": 50, "num-rounds": 150, "adept-ae.latent": 10,
        "adept-ae.architecture": "linear", "adept.sigma-init": 1.0, "lr": 0.01,
    },
    ("adept_ae_cifar10_table2.toml", "adept-high"): {
        "adept-ae.architecture": "conv", "adept-ae.latent": 50, "num-rounds": 250,
        "adept.sigma-init": 0.2, "adept-ae.lazy-rounds": 200,
    },
    ("adept_dgm_mnist_table3.toml", "adept-high"): {
        "adept-dgm.channels": 32, "adept-dgm.kernel": 5, "num-rounds": 100, "lr": 1e-3,
        "adept.sigma-init": 0.8, "adept-dgm.samples": 200, "adept-dgm.sample-steps": 500,
        "adept-dgm.mu-optimizer": "adam", "lr-schedule": "late-drop",
    },
}  # fmt: skip


@pytest.mark.parametrize(("file", "method"), list(PAPER_SETTINGS))
def test_recipes_keep_the_papers_settings(file: str, method: str) -> None:
    from pollen.core.runconfig import resolve

    exp = Experiment.load(EXPERIMENTS / file)
    settings = resolve(method_settings(exp, exp.methods[method], exp.seeds[0]))
    for key, value in PAPER_SETTINGS[(file, method)].items():
        assert settings[key] == pytest.approx(value), (file, method, key)


def test_every_experiment_that_reads_a_data_dir_has_a_stand_in_test() -> None:
    """The files that need downloaded or preprocessed data are the recipes tested above."""
    needs_data = set()
    for path in EXPERIMENTS.glob("*.toml"):
        exp = Experiment.load(path)
        if any("data-dir" in {**exp.common, **cfg} for cfg in exp.methods.values()):
            needs_data.add(path.name)
    assert needs_data == {r.file for r in RECIPES}
    assert {file for file, _ in PAPER_SETTINGS} <= needs_data
