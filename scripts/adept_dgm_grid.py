"""ADEPT-DGM's sample figure (like the paper's Fig. 6) and per-client KID table, from a
finished `pollen experiment` results directory of experiments/adept_dgm_*.toml.

    python scripts/adept_dgm_grid.py results/adept-dgm-digits [client ...]

For each chosen client (default 0 and 1) it shows the first row of its test images and of
every method's samples (<run>/samples/client-<i>.png, seed 0), writes
<results>/adept_dgm_samples.png, and prints the mean, median and worst (max) per-client KID of
each method.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

METHODS = {"adept": "ADEPT-DGM", "local": "Local", "fedavg-ft": "FedAvg + FT", "fedavg": "FedAvg"}


def first_row(png: Path) -> np.ndarray:
    """The top row of a grid written by client.adept_dgm.save_grid (square cells)."""
    from PIL import Image

    img = np.asarray(Image.open(png))
    return img[: (img.shape[1] - 1) // 10 + 1]


def main(results: Path, clients: list[int]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {m: results / f"{m}-seed0" / "samples" for m in METHODS}
    runs = {m: d for m, d in runs.items() if d.is_dir()}
    rows = ["test", *runs]
    size = (4.2 * len(clients), 0.62 * len(rows) + 0.4)
    fig, axes = plt.subplots(len(rows), len(clients), figsize=size, squeeze=False)
    first = next(iter(runs.values()))
    for j, cid in enumerate(clients):
        for i, row in enumerate(rows):
            png = (
                first / f"client-{cid}-test.png"
                if row == "test"
                else runs[row] / f"client-{cid}.png"
            )
            ax = axes[i][j]
            ax.imshow(first_row(png), cmap="gray", vmin=0, vmax=255)
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                label = "test" if row == "test" else METHODS[row]
                ax.set_ylabel(label, rotation=0, ha="right", va="center")
            if i == 0:
                ax.set_title(f"client {cid}")
    fig.tight_layout()
    out = results / "adept_dgm_samples.png"
    fig.savefig(out, dpi=110)
    print("| method | KID mean | median | worst client |")
    for m, d in runs.items():
        kids = [json.loads(p.read_text())["sample-kid"] for p in d.glob("client-*.json")]
        print(
            f"| {METHODS[m]} | {np.mean(kids):.3f} | {np.median(kids):.3f} | {np.max(kids):.3f} |"
        )
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1]), [int(c) for c in sys.argv[2:]] or [0, 1]))
