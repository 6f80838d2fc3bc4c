"""Linear probe of a FedSC experiment's final encoders on two feature sets (after
`pollen experiment experiments/fedsc_mnist_5x2_e5.toml --out DIR`):

    python -m experiments.fedsc_probe_features DIR

For each run it loads final_model.npz and probes the backbone's features (the paper's protocol,
the runs' `probe-accuracy`) and the projector's outputs z, on which FedSC's inter-client term
acts; row "untrained" probes each seed's initial model, once for each data split and encoder
the runs use (rows "untrained (data of METHODS)" when there are several, e.g. a centralised
method next to the federated ones). Same data, probe and seed as the runs' own final evaluation.
Writes DIR/probe-features.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pollen.core import rundir

if TYPE_CHECKING:
    from strategies.fedsc import FedSC, RepresentationEvaluator

FEATURES = ("backbone", "projector")


def probe(evaluator: Any, weights: dict[str, np.ndarray]) -> dict[str, float]:
    """Last-epoch probe accuracy (%) of `weights` on each feature set, with the run's
    RepresentationEvaluator (its data, probe settings and seed)."""
    net = evaluator.net(weights)
    modules = (net.backbone, net)
    return {f: 100.0 * evaluator.linear_probe(m)[0] for f, m in zip(FEATURES, modules, strict=True)}


def strategy_of(settings: dict[str, Any]) -> FedSC:
    """A fresh server strategy of the run's algorithm, as its registry entry names it (the
    network of FedAvg + BYOL's has a predictor)."""
    from pollen.core.registry import get_algorithm
    from pollen.core.settings import RunSettings
    from strategies.base import strategy_class
    from strategies.fedsc import FedSC

    algorithm = RunSettings.of(settings).algorithm
    strategy = strategy_class(get_algorithm(algorithm))(settings)
    if not isinstance(strategy, FedSC):
        raise SystemExit(f"algorithm {algorithm!r} is not one of FedSC's family")
    return strategy


def evaluator_of(settings: dict[str, Any]) -> RepresentationEvaluator:
    """The run's RepresentationEvaluator (its network, data, probe settings and seed)."""
    return strategy_of(settings).evaluator


def initial_weights(settings: dict[str, Any]) -> dict[str, np.ndarray]:
    """The model the run started from."""
    initial = strategy_of(settings)
    initial.initialize(initial.run.seed)
    return dict(initial.weights)


def settings_of(run: Path) -> dict[str, Any]:
    return rundir.read_object(run / rundir.CONFIG)


def untrained_key(settings: dict[str, Any]) -> str:
    """What the untrained probe of a run depends on, apart from the seed: its data split and
    encoder (runs of one seed with equal keys start from the same model and data)."""
    from pollen.core.contracts.fedsc import FedSCSettings
    from pollen.core.dataspec import data_spec

    split = dataclasses.replace(data_spec(settings), seed=0)
    fedsc = FedSCSettings.of(settings)
    model = [fedsc.encoder, fedsc.dim, fedsc.hidden]
    probe = [fedsc.probe_epochs, fedsc.probe_lr]
    return repr((split, model, probe))


def _rounded(accuracies: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in accuracies.items()}


def table(
    results: dict[str, list[dict[str, float]]],
    columns: dict[str, str] | None = None,
    digits: int = 1,
) -> str:
    """Markdown table: one row per method, a `mean ± std (per seed)` cell per column
    (key -> heading; default the probe's feature sets)."""
    columns = columns or {f: f"probe on {f}" for f in FEATURES}
    lines = ["| method | " + " | ".join(columns.values()) + " |"]
    lines.append("|---" * (len(columns) + 1) + "|")
    for method, seeds in results.items():
        cells = []
        for f in columns:
            values = [s[f] for s in seeds]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            per_seed = " / ".join(f"{v:.{digits}f}" for v in values)
            cells.append(f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f} ({per_seed})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="results directory of a FedSC experiment")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {}
    runs = sorted(args.out.glob("*-seed*/final_model.npz"))
    if not runs:
        raise SystemExit(f"no runs with a final_model.npz in {args.out}")
    # the initial models are probed once per (seed, data split and encoder), with the data of
    # the first run of that setup
    untrained: dict[str, dict[str, dict[str, float]]] = {}  # setup -> seed -> accuracies
    users: dict[str, list[str]] = {}  # setup -> methods using it
    for path in runs:
        run = path.parent
        method, _, seed = run.name.rpartition("-seed")
        settings = settings_of(run)
        evaluator = evaluator_of(settings)
        if evaluator.data is None:
            raise SystemExit(f"{run}: the server-side data of this run cannot be loaded")
        with np.load(path) as saved:
            results.setdefault(method, []).append(probe(evaluator, dict(saved)))
        print(run.name, _rounded(results[method][-1]))
        setup = untrained_key(settings)
        if method not in users.setdefault(setup, []):
            users[setup].append(method)
        seeds = untrained.setdefault(setup, {})
        if seed not in seeds:
            seeds[seed] = probe(evaluator, initial_weights(settings))
            print(f"untrained seed{seed} (data of {run.name})", _rounded(seeds[seed]))
    for setup, seeds in untrained.items():
        many = len(untrained) > 1
        row = f"untrained (data of {', '.join(users[setup])})" if many else "untrained"
        results[row] = [seeds[seed] for seed in sorted(seeds)]
    text = table(results)
    (args.out / "probe-features.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
