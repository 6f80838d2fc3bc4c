"""FeDLRT's least-squares experiments (after the paper's Section 4.1), run without Flower on
models.fedlrt:

  H1  homogeneous: n = 20, rank-4 target, 10,000 points, 4 iid clients, simplified correction,
      λ = 1e-2, s* = 20, τ = 0.1, initial rank 10, 400 rounds; FedLin with the same λ, s*.
  H2  heterogeneous (client drift): n = 10, rank-2 global optimum, 4 clients with non-iid
      features and different targets, λ = 1e-3, s* = 100, τ = 0.01, initial rank 5, 200 rounds;
      FedAvg, FedLin and FeDLRT without, with simplified and with full correction.

    python -m experiments.fedlrt_least_squares --out results/fedlrt-least-squares

writes results.md (tables), results.json (per-round histories) and h1.png, h2.png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from models.least_squares import (
    History,
    global_loss,
    heterogeneous_problem,
    homogeneous_problem,
    initial_factors,
    run_dense,
    run_fedlrt,
)

H2_METHODS = ("fedavg", "fedlrt-none", "fedlrt-simplified", "fedlin", "fedlrt-full")


def _first(values: list[float] | list[int], test: Any) -> int | None:
    """1-based round at which `test` first holds."""
    return next((i + 1 for i, v in enumerate(values) if test(v)), None)


def homogeneous(seed: int, rounds: int) -> dict[str, Any]:
    clients, target = homogeneous_problem(n=20, rank=4, points=10_000, clients=4, seed=seed)
    start = initial_factors(20, 10, seed)
    t0 = time.perf_counter()
    lrt = run_fedlrt(clients, start, "simplified", lr=1e-2, steps=20, rounds=rounds, tau=0.1)
    t1 = time.perf_counter()
    lin = run_dense(clients, start.dense(), lr=1e-2, steps=20, rounds=rounds, corrected=True)
    hit = _first(lrt.rank, lambda r: r == 4)
    return {
        "fedlrt": _history(lrt, target) | {"seconds": t1 - t0},
        "fedlin": _history(lin, target) | {"seconds": time.perf_counter() - t1},
        "rank-4-at": hit,
        "min-rank-after": min(lrt.rank[hit - 1 :]) if hit else None,
        "loss-1e-8-at": _first(lrt.loss, lambda v: v < 1e-8),
    }


def heterogeneous(seed: int, rounds: int) -> dict[str, Any]:
    clients, optimum = heterogeneous_problem(n=10, rank=2, points_per_client=2500, seed=seed)
    start = initial_factors(10, 5, seed)
    best = global_loss(clients, optimum)
    out: dict[str, Any] = {}
    for method in H2_METHODS:
        t0 = time.perf_counter()
        if method.startswith("fedlrt-"):
            var_cor = method.removeprefix("fedlrt-")
            hist = run_fedlrt(clients, start, var_cor, lr=1e-3, steps=100, rounds=rounds, tau=0.01)
        else:
            hist = run_dense(clients, start.dense(), lr=1e-3, steps=100, rounds=rounds,
                             corrected=method == "fedlin")  # fmt: skip
        hist.loss = [v - best for v in hist.loss]  # the optimality gap L(W) − L(W*)
        out[method] = _history(hist, optimum) | {"seconds": time.perf_counter() - t0}
    return out


def _history(hist: History, target: np.ndarray) -> dict[str, Any]:
    return {
        "loss": hist.loss,
        "rank": hist.rank,
        "distance": float(np.linalg.norm(hist.W - target)),
        "orthonormality-max": max(hist.orthonormality, default=0.0),
        "truncation-ratio-max": max((d / t for d, t in hist.truncation if t > 0), default=0.0),
    }


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.1e}" if lo == hi else f"{lo:.1e} … {hi:.1e}"


def report(h1: dict[int, Any], h2: dict[int, Any]) -> str:
    seeds1, seeds2 = sorted(h1), sorted(h2)
    lines = ["# FeDLRT least squares", "", f"## H1 homogeneous (seeds {seeds1})", ""]
    lines += [
        "| seed | rank 4 first at round | min rank afterwards | FeDLRT loss < 1e-8 at round "
        "| FeDLRT final loss | FeDLRT ‖W − W_r‖ | FedLin final loss | FedLin ‖W − W_r‖ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in seeds1:
        r = h1[s]
        lines.append(
            f"| {s} | {r['rank-4-at']} | {r['min-rank-after']} | {r['loss-1e-8-at']} | "
            f"{r['fedlrt']['loss'][-1]:.1e} | {r['fedlrt']['distance']:.1e} | "
            f"{r['fedlin']['loss'][-1]:.1e} | {r['fedlin']['distance']:.1e} |"
        )
    lines += ["", f"## H2 heterogeneous (seeds {seeds2}), after the last round", ""]
    lines += ["| method | gap L(W) − L(W*) | ‖W − W*‖ | final rank | seconds/run |",
              "|---|---|---|---|---|"]  # fmt: skip
    for m in H2_METHODS:
        runs = [h2[s][m] for s in seeds2]
        ranks = sorted({r["rank"][-1] for r in runs})
        lines.append(
            f"| {m} | {_span([r['loss'][-1] for r in runs])} | "
            f"{_span([r['distance'] for r in runs])} | {', '.join(map(str, ranks))} | "
            f"{np.mean([r['seconds'] for r in runs]):.1f} |"
        )
    worst = max(
        [h1[s]["fedlrt"]["orthonormality-max"] for s in seeds1]
        + [h2[s][m]["orthonormality-max"] for s in seeds2 for m in H2_METHODS]
    )
    lines += ["", f"Largest |U^T U − I| over all FeDLRT rounds: {worst:.1e}.", ""]
    return "\n".join(lines)


def plot(h1: dict[int, Any], h2: dict[int, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    for s, r in sorted(h1.items()):
        ax[0].plot(range(1, len(r["fedlrt"]["rank"]) + 1), r["fedlrt"]["rank"], label=f"seed {s}")
        ax[1].semilogy(r["fedlrt"]["loss"], color=f"C{s}", label=f"FeDLRT seed {s}")
        ax[1].semilogy(r["fedlin"]["loss"], color=f"C{s}", ls="--", label=f"FedLin seed {s}")
    ax[0].set(xlabel="aggregation round", ylabel="rank", title="H1: rank (true rank 4)")
    ax[1].set(xlabel="aggregation round", ylabel="global loss", title="H1: loss")
    ax[0].legend(), ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "h1.png", dpi=110)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    seed = min(h2)
    for i, m in enumerate(H2_METHODS):
        ax[0].semilogy(np.maximum(h2[seed][m]["loss"], 1e-16), color=f"C{i}", label=m)
        if m.startswith("fedlrt"):
            ax[1].plot(h2[seed][m]["rank"], color=f"C{i}", label=m)
    ax[0].set(xlabel="aggregation round", ylabel="L(W) − L(W*)", title=f"H2 (seed {seed}): gap")
    ax[1].set(xlabel="aggregation round", ylabel="rank", title="H2: rank (optimum's rank 2)")
    ax[0].legend(fontsize=7), ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "h2.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/fedlrt-least-squares"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--h1-rounds", type=int, default=400)
    parser.add_argument("--h2-rounds", type=int, default=200)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    h1, h2 = {}, {}
    for seed in args.seeds:
        h1[seed] = homogeneous(seed, args.h1_rounds)
        print(f"H1 seed {seed}: rank 4 at round {h1[seed]['rank-4-at']}, "
              f"loss {h1[seed]['fedlrt']['loss'][-1]:.1e}", flush=True)  # fmt: skip
        h2[seed] = heterogeneous(seed, args.h2_rounds)
        print(f"H2 seed {seed}: " + ", ".join(
            f"{m} {h2[seed][m]['loss'][-1]:.1e}" for m in H2_METHODS), flush=True)  # fmt: skip
    (args.out / "results.json").write_text(json.dumps({"h1": h1, "h2": h2}) + "\n")
    text = report(h1, h2)
    (args.out / "results.md").write_text(text)
    plot(h1, h2, args.out)
    print(text)


if __name__ == "__main__":
    main()
