"""Accuracy against epsilon under differential privacy (docs/results/privacy.md): client-level
DP (DP-FedAvg, noise on the server) for FedAvg and FedEM, beside example-level DP-SGD for
FedAvg, on `mnist-5k` with 100 simulated clients, several noise levels, three seeds; and, at
the epsilons the noise on the server reaches, client-level DP with the noise on the clients:
shared out under secure aggregation ('distributed') and each client's own ('local'); and the
noise on the server under FedBuff ('fedbuff': 50-reply buffers, 50 clients training, 20 model
versions, accounted without amplification).

    python -m experiments.client_dp run --out DIR [--algorithms fedavg,fedem] [--seeds 0,1,2]
        [--levels client,adaptive,example,distributed,local,fedbuff]
    python -m experiments.client_dp tabulate DIR

Every run is one federation through the real ServerApp and ClientApp in one process
(server.local_grid, as experiments/robustness.py runs them); runs already in
DIR/results.jsonl are skipped. Each round samples every client independently with
probability 0.5 (client-level DP's Poisson sampling; DP-SGD and the non-private runs sample
half of the clients), 20 rounds. The clipping bound (1.0) and the noise levels are round
numbers fixed before any run, not tuned on the test split. The noise is drawn from the run's
seed (`client-dp.reproducible`, `dp.reproducible`) so that a run can be repeated: the epsilons
are those of the mechanism, for anyone who does not know the seed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.robustness import grid_cli, names, rows, run
from pollen.core import rundir

BASE: dict[str, Any] = {
    "dataset": "mnist-5k",
    "model": "mlp",
    "num-clients": 100,
    "num-rounds": 20,
    "lr": 0.1,
    "batch-size": 16,
    "fraction-train": 0.5,
    "server-eval": False,
    "phase-timeout": 600.0,
    "wait-for-clients": 5.0,
    "poll-interval": 0.01,
}
CLIP = 1.0
"""client-dp.clip of every client-level run (dp.max-grad-norm of DP-SGD: also 1.0)."""
LEVELS: dict[str, tuple[float, ...]] = {
    "client": (0.5, 1.0, 2.0, 4.0, 8.0),
    "adaptive": (0.5, 1.0, 2.0, 4.0),
    "example": (0.5, 1.0, 2.0),
    "distributed": (51.0, 16.6, 6.23),
    "local": (51.0, 16.6, 6.23),
    "distributed-z": (1.0, 2.0),
    "fedbuff": (0.0, 51.0, 16.6, 6.23),
}
"""Noise multipliers: client-level DP's z (fixed clipping at CLIP; adaptive clipping from CLIP
towards the median update norm, whose count noise m / 20 = 2.5 admits z < 5), DP-SGD's
(example-level). For 'distributed' and 'local', target epsilons instead: those the noise on
the server reaches at z = 0.5, 1 and 2, each mode's noise calibrated to them for its own
accounting (`client-dp.target-epsilon`). 'distributed-z': the noise shared out at the server
noise's z = 1 and 2 (the same noise in the sum; its own epsilon). 'fedbuff': target epsilons
too, the noise on the server under FedBuff (0: FedBuff without DP, its reference)."""
TARGETED = ("distributed", "local", "fedbuff")
"""The levels whose `noise` is a target epsilon."""
DELTA = 1e-5


@dataclass(frozen=True)
class Case:
    algorithm: str
    level: str  # "none", "client" / "adaptive" (client-level DP) or "example" (DP-SGD)
    noise: float
    seed: int

    @property
    def name(self) -> str:
        letter = "e" if self.level in TARGETED else "z"
        noise = f"-{letter}{self.noise:g}" if self.level != "none" else ""
        return f"{self.algorithm}-{self.level}{noise}-s{self.seed}"

    def settings(self, out: Path, cache: Path) -> dict[str, Any]:
        cfg = {**BASE, "algorithm": self.algorithm, "seed": self.seed}
        if self.level in ("client", "adaptive"):
            cfg.update({"client-dp.noise-multiplier": self.noise, "client-dp.clip": CLIP,
                        "client-dp.delta": DELTA, "client-dp.reproducible": True})  # fmt: skip
            if self.level == "adaptive":
                cfg["client-dp.target-quantile"] = 0.5
        elif self.level == "fedbuff":  # the synchronous runs' expected 50 clients a version
            cfg.update({"async.buffer": 50, "async.concurrency": 50})
            if self.noise > 0:
                cfg.update({"client-dp.target-epsilon": self.noise, "client-dp.clip": CLIP,
                            "client-dp.delta": DELTA, "client-dp.reproducible": True})  # fmt: skip
        elif self.level in TARGETED:
            cfg.update({"client-dp.target-epsilon": self.noise, "client-dp.clip": CLIP,
                        "client-dp.noise-at": "client", "client-dp.delta": DELTA,
                        "client-dp.reproducible": True,
                        "secagg.enabled": self.level == "distributed"})  # fmt: skip
        elif self.level == "distributed-z":
            cfg.update({"client-dp.noise-multiplier": self.noise, "client-dp.clip": CLIP,
                        "client-dp.noise-at": "client", "client-dp.delta": DELTA,
                        "client-dp.reproducible": True, "secagg.enabled": True})  # fmt: skip
        elif self.level == "example":
            cfg.update({"dp.noise-multiplier": self.noise, "dp.max-grad-norm": CLIP,
                        "dp.delta": DELTA, "dp.reproducible": True})  # fmt: skip
        cfg.update(
            {
                "out-dir": str(out / "runs" / self.name),
                "run-name": self.name,
                "cache-dir": str(cache),
                "client-state-dir": str(out / "state"),
            }
        )
        return cfg


def cases(algorithms: Iterable[str], levels: Iterable[str], seeds: Iterable[int]) -> list[Case]:
    """The grid: each algorithm without DP and at every noise level of each kind asked for
    (DP-SGD for FedAvg only: the record-level curve the figure compares with)."""
    out = []
    for a in algorithms:
        for s in seeds:
            out.append(Case(a, "none", 0.0, s))
            for level in levels:
                if level == "example" and a != "fedavg":
                    continue
                out.extend(Case(a, level, z, s) for z in LEVELS[level])
    return out


def guarantee_of(out: Path, name: str, level: str, key: str = "epsilon") -> float | None:
    """A figure (`key`: its epsilon, its noise multiplier) of the guarantee a run's summary
    states (client-level, or DP-SGD's)."""
    summary = rundir.read_summary(out / "runs" / name)
    if level == "none" or summary is None:
        return None
    privacy = summary.privacy or {}
    entry = privacy.get("example-level" if level == "example" else "client-level", {})
    value = entry.get(key)
    return float(value) if isinstance(value, int | float) else None


def epsilon_of(out: Path, name: str, level: str) -> float | None:
    """The epsilon a run's summary states for its guarantee (client-level, or DP-SGD's)."""
    return guarantee_of(out, name, level)


def summarise(out: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (algorithm, level, noise): accuracy mean and spread over seeds, and the epsilon
    (the same for every seed: it depends on the mechanism only)."""
    by: dict[str, dict[str, Any]] = {}
    for r in results:
        c = r["case"]
        key = f"{c['algorithm']}/{c['level']}/{c['noise']:g}"
        cell = by.setdefault(key, {"accuracies": [], "epsilon": None})
        ok = r.get("status") == "completed" and r.get("accuracy") is not None
        cell["accuracies"].append(float(r["accuracy"]) if ok else 0.0)
        cell["epsilon"] = epsilon_of(out, r["name"], c["level"]) or cell["epsilon"]
        if c["level"] in TARGETED:  # the noise the target called for, and against the server
            z = guarantee_of(out, r["name"], c["level"], "noise-multiplier")
            cell["noise-multiplier"] = z if z is not None else cell.get("noise-multiplier")
            vs = guarantee_of(out, r["name"], c["level"], "epsilon-vs-server")
            cell["epsilon-vs-server"] = vs if vs is not None else cell.get("epsilon-vs-server")
    for cell in by.values():
        accs = cell["accuracies"]
        mean = sum(accs) / len(accs)
        cell["mean"] = round(mean, 4)
        cell["std"] = round(math.sqrt(sum((a - mean) ** 2 for a in accs) / len(accs)), 4)
        cell["seeds"] = len(accs)
    return dict(sorted(by.items()))


LABELS = {
    ("fedavg", "client"): "FedAvg, client-level DP (DP-FedAvg), clip 1",
    ("fedavg", "adaptive"): "FedAvg, client-level DP, adaptive clipping",
    ("fedem", "client"): "FedEM, client-level DP, clip 1",
    ("fedem", "adaptive"): "FedEM, client-level DP, adaptive clipping",
    ("fedavg", "example"): "FedAvg, example-level DP-SGD",
    ("fedavg", "distributed"): "FedAvg, client-level DP, noise shared out (secure aggregation)",
    ("fedavg", "local"): "FedAvg, client-level DP, noise on each client",
    ("fedavg", "distributed-z"): "FedAvg, noise shared out at the server noise's z",
    ("fedavg", "fedbuff"): "FedAvg under FedBuff, noise on the server (no amplification)",
}


def markdown(table: Mapping[str, Any]) -> str:
    lines = [
        "| algorithm | guarantee | noise multiplier | epsilon (delta 1e-5) | test accuracy "
        "(mean ± std) | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for key, cell in table.items():
        alg, level, noise = key.split("/")
        eps = cell["epsilon"]
        shown = "-" if eps is None else ("none (no noise)" if eps < 0 else f"{eps:.2f}")
        guarantee = {"none": "none", "client": "client-level", "adaptive": "client-level, adaptive",
                     "example": "example-level", "distributed": "client-level, distributed",
                     "local": "client-level, on each client",
                     "distributed-z": "client-level, distributed",
                     "fedbuff": "client-level, FedBuff"}[level]  # fmt: skip
        if level == "fedbuff" and float(noise) == 0:
            guarantee = "none, FedBuff"
        z = cell.get("noise-multiplier") if level in TARGETED else noise
        z_shown = "-" if level == "none" or z is None else f"{float(z):.3g}"
        lines.append(
            f"| {alg} | {guarantee} | {z_shown} | {shown} | "
            f"{cell['mean']:.3f} ± {cell['std']:.3f} | {cell['seeds']} |"
        )
    return "\n".join(lines) + "\n"


def figure(table: Mapping[str, Any], path: Path) -> None:
    """Test accuracy against epsilon (log scale), one line per algorithm and guarantee, the
    runs without DP as broad pale horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 5.8))
    colours = {"fedavg": "tab:blue", "fedem": "tab:orange"}
    for (alg, level), label in LABELS.items():
        points = sorted(
            (cell["epsilon"], cell["mean"], cell["std"])
            for key, cell in table.items()
            if key.startswith(f"{alg}/{level}/") and cell["epsilon"] not in (None, -1.0)
        )
        if not points:
            continue
        xs, ys, sd = zip(*points, strict=True)
        style = {"client": "-o", "adaptive": "-.^", "example": ":s", "distributed": "--D",
                 "local": ":x", "distributed-z": "P", "fedbuff": "--v"}[level]  # fmt: skip
        ax.errorbar(xs, ys, yerr=sd, fmt=style, color=colours[alg], label=label, capsize=3)
    for alg, colour in colours.items():
        clean = table.get(f"{alg}/none/0")
        if clean:
            ax.axhline(clean["mean"], color=colour, linewidth=3, alpha=0.3,
                       label=f"{'FedAvg' if alg == 'fedavg' else 'FedEM'}, no DP")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("epsilon at delta 1e-5 (client-level: per client; DP-SGD: per example)")
    ax.set_ylabel("final mean client test accuracy")
    ax.set_title("mnist-5k, 100 clients, 20 rounds, half sampled per round")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser, p = grid_cli(__doc__)
    p.add_argument("--algorithms", default="fedavg,fedem")
    p.add_argument("--levels", default="client,adaptive,example")
    args = parser.parse_args(argv)
    if args.command == "run":
        seeds = [int(x) for x in names(args.seeds)]
        run(cases(names(args.algorithms), names(args.levels), seeds), args.out, args.jobs)
        return 0
    table = summarise(args.out, rows(args.out))
    (args.out / "client_dp.json").write_text(json.dumps(table, indent=1, sort_keys=True))
    text = markdown(table)
    (args.out / "table.md").write_text(text)
    figure(table, args.out / "client_dp.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
