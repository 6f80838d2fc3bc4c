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
import json
import statistics
from pathlib import Path

import numpy as np

FEATURES = ("backbone", "projector")


def probe_run(run: Path, untrained: bool = False) -> dict[str, float]:
    """Last-epoch probe accuracy (%) on each feature set of the run's final model (untrained:
    of the model the run started from)."""
    from strategies.fedsc import FedAvgSC, RepresentationEvaluator

    settings = json.loads((run / "config.json").read_text())
    evaluator = RepresentationEvaluator(settings)
    if evaluator.data is None:
        raise SystemExit(f"{run}: the server-side data of this run cannot be loaded")
    if untrained:
        initial = FedAvgSC(settings)
        initial.initialize(int(settings["seed"]))
        weights = dict(initial.weights)
    else:
        with np.load(run / "final_model.npz") as saved:
            weights = {k: saved[k] for k in saved.files}
    net = evaluator.net(weights)
    modules = (net.backbone, net)
    return {f: 100.0 * evaluator.linear_probe(m)[0] for f, m in zip(FEATURES, modules, strict=True)}


def untrained_key(run: Path) -> str:
    """What the untrained probe of a run depends on, apart from the seed: its data split and
    encoder (runs of one seed with equal keys start from the same model and data)."""
    from pollen.dataspec import data_spec

    settings = json.loads((run / "config.json").read_text())
    split = dataclasses.replace(data_spec(settings), seed=0)
    model = [settings[k] for k in ("fedsc.encoder", "fedsc.dim", "fedsc.hidden")]
    probe = [settings[k] for k in ("fedsc.probe-epochs", "fedsc.probe-lr")]
    return repr((split, model, probe))


def _rounded(accuracies: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in accuracies.items()}


def table(results: dict[str, list[dict[str, float]]]) -> str:
    lines = ["| method | " + " | ".join(f"probe on {f}" for f in FEATURES) + " |"]
    lines.append("|---" * (len(FEATURES) + 1) + "|")
    for method, seeds in results.items():
        cells = []
        for f in FEATURES:
            values = [s[f] for s in seeds]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            per_seed = " / ".join(f"{v:.1f}" for v in values)
            cells.append(f"{statistics.mean(values):.1f} ± {spread:.1f} ({per_seed})")
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
    # the initial models to probe: one run per (seed, data split and encoder)
    setups: dict[str, dict[str, Path]] = {}  # setup without seed -> seed -> run
    users: dict[str, list[str]] = {}  # setup -> methods using it
    for path in runs:
        method, _, seed = path.parent.name.rpartition("-seed")
        results.setdefault(method, []).append(probe_run(path.parent))
        print(path.parent.name, _rounded(results[method][-1]))
        setup = untrained_key(path.parent)
        setups.setdefault(setup, {}).setdefault(seed, path.parent)
        if method not in users.setdefault(setup, []):
            users[setup].append(method)
    for setup, first_of_seed in setups.items():
        row = "untrained" if len(setups) == 1 else f"untrained (data of {', '.join(users[setup])})"
        for seed, run in sorted(first_of_seed.items()):
            results.setdefault(row, []).append(probe_run(run, untrained=True))
            print(f"{row} seed{seed}", _rounded(results[row][-1]))
    text = table(results)
    (args.out / "probe-features.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
