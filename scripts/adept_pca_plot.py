"""ADEPT-PCA's figure (paper Fig. 3): error ratio against heterogeneity for ADEPT, local and
global PCA and FedAvg + fine-tuning, and the sigma ADEPT learned, from a finished `pollen
experiment` results directory.

    python scripts/adept_pca_plot.py experiments/adept_pca_synthetic.toml \
        results/adept-pca-synthetic

Writes <results>/adept_pca_ratio.png and prints the table the README quotes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pollen.core.settings import SyntheticSettings
from pollen.tools.experiment import Experiment

CURVES = {"adept": "ADEPT-PCA", "local": "local", "global": "global", "fedavg-ft": "FedAvg + FT"}


def main(experiment: Path, results: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exp = Experiment.load(experiment)
    table = json.loads((results / "results.json").read_text())["methods"]
    points: dict[str, list[tuple[float, float, float]]] = {k: [] for k in CURVES}
    for method, stats in table.items():
        kind = method.rsplit("-", 1)[0]  # "fedavg-ft-h01" -> "fedavg-ft"
        ratio, sigma = stats.get("error-ratio", {}), stats.get("sigma-mean", {})
        if kind not in points or ratio.get("mean") is None:
            continue
        het = SyntheticSettings.of({**exp.common, **exp.methods[method]}).heterogeneity
        points[kind].append((het, float(ratio["mean"]), float(sigma.get("mean") or 0.0)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    print(f"| heterogeneity | {' | '.join(CURVES.values())} | learned sigma |")
    print("|---" * (len(CURVES) + 2) + "|")
    for kind, label in CURVES.items():
        rows = sorted(points[kind])
        left.plot([p[0] for p in rows], [p[1] for p in rows], marker="o", label=label)
    adept = sorted(points["adept"])
    right.plot([p[0] for p in adept], [p[2] for p in adept], marker="o", color="C0")
    by_het = {kind: {p[0]: p for p in rows} for kind, rows in points.items()}
    for het, *_ in adept:
        cells = [f"{by_het[k][het][1]:.3f}" if het in by_het[k] else "–" for k in CURVES]
        print(f"| {het} | {' | '.join(cells)} | {by_het['adept'][het][2]:.4f} |")
    left.set(xlabel="heterogeneity (perturbation std)", ylabel="error / true model's error")
    left.legend()
    right.set(xlabel="heterogeneity (perturbation std)", ylabel="learned sigma")
    fig.tight_layout()
    out = results / "adept_pca_ratio.png"
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(main(Path(sys.argv[1]), Path(sys.argv[2])))
