"""FeDLRT's least-squares experiments (after the paper's Section 4.1), run without Flower on
models.fedlrt:

  H1  homogeneous: n = 20, rank-4 target, 10,000 points, 4 iid clients, simplified correction,
      λ = 1e-2, s* = 20, τ = 0.1, initial rank 10, 400 rounds; FedLin with the same λ, s*.
  H2  heterogeneous (client drift): n = 10, rank-2 global optimum, 4 clients with non-iid
      features and different targets, λ = 1e-3, s* = 100, τ = 0.01, initial rank 5, 200 rounds;
      FedAvg, FedLin and FeDLRT without, with simplified and with full correction.
  Figure 4 (--paper), the paper's own homogeneous setting: H1's problem (one data seed) with
      λ = 1e-3, s* = 20, τ = 0.1, C = 1, 2, 4, 8, 16, 32 clients, 20 initial weights per C
      (initial rank 10), FeDLRT with simplified correction against FedLin; per round the
      median over the initial weights of the rank, ‖W − W_r‖ and the losses.

    python -m experiments.fedlrt_least_squares --out results/fedlrt-least-squares
    python -m experiments.fedlrt_least_squares --paper --out results/fedlrt-figure4
    python -m experiments.fedlrt_least_squares --paper --tabulate A/figure4.json B/figure4.json \
        --out DIR      # one table and figure from runs made in parts

write results.md (tables), results.json (per-round histories) and h1.png, h2.png; with
--paper, figure4.md, figure4.json (median histories, per-initialisation summaries) and
figure4.png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from models.least_squares import (
    GramClient,
    History,
    global_loss,
    heterogeneous_problem,
    homogeneous_problem,
    initial_factors,
    run_dense,
    run_fedlrt,
)

H2_METHODS = ("fedavg", "fedlrt-none", "fedlrt-simplified", "fedlin", "fedlrt-full")
PAPER_CLIENTS = (1, 2, 4, 8, 16, 32)
PAPER_METHODS = ("fedlrt", "fedlin")


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


def figure4(clients: int, inits: int, rounds: int, data_seed: int = 0) -> dict[str, Any]:
    """The paper's Figure 4 setting for one client count: the same 10,000 points and rank-4
    target (data seed `data_seed`) split over `clients`, FeDLRT (simplified correction,
    λ = 1e-3, s* = 20, τ = 0.1, initial rank 10) and FedLin (λ = 1e-3, s* = 20) from each of
    `inits` initial weights; per-round medians over the initial weights and per-run summaries."""
    data, target = homogeneous_problem(n=20, rank=4, points=10_000, clients=clients,
                                       seed=data_seed)  # fmt: skip
    # the same gradients from the normal equations (n⁴ a gradient) where that is cheaper than
    # from the data (N_c n² a gradient): when a client holds more than n² points
    problem = [GramClient.of(c) if len(c) > 20 * 20 else c for c in data]
    series: dict[str, dict[str, list[list[float]]]] = {
        m: {"loss": [], "distance": [], "rank": []} for m in PAPER_METHODS
    }
    runs: list[dict[str, Any]] = []
    for init in range(inits):
        start = initial_factors(20, 10, init)
        t0 = time.perf_counter()
        lrt = run_fedlrt(problem, start, "simplified", lr=1e-3, steps=20, rounds=rounds,
                         tau=0.1, target=target)  # fmt: skip
        t1 = time.perf_counter()
        lin = run_dense(problem, start.dense(), lr=1e-3, steps=20, rounds=rounds,
                        corrected=True, target=target)  # fmt: skip
        t2 = time.perf_counter()
        for method, hist in (("fedlrt", lrt), ("fedlin", lin)):
            series[method]["loss"].append(hist.loss)
            series[method]["distance"].append(hist.distance)
            series[method]["rank"].append([float(r) for r in hist.rank])
        hit = _first(lrt.rank, lambda r: r == 4)
        runs.append({
            "init": init,
            "rank-4-at": hit,
            "min-rank-after": min(lrt.rank[hit - 1 :]) if hit else None,
            "min-rank": min(lrt.rank),
            "final-rank": lrt.rank[-1],
            "fedlrt-distance": lrt.distance[-1],
            "fedlin-distance": lin.distance[-1],
            "fedlrt-1e-5-at": _first(lrt.distance, lambda v: v < 1e-5),
            "fedlin-1e-5-at": _first(lin.distance, lambda v: v < 1e-5),
            "fedlrt-seconds": t1 - t0,
            "fedlin-seconds": t2 - t1,
        })  # fmt: skip
    median = {
        m: {k: np.median(np.array(v), axis=0).tolist() for k, v in series[m].items()}
        for m in PAPER_METHODS
    }
    return {"clients": clients, "inits": inits, "rounds": rounds, "data-seed": data_seed,
            "median": median, "runs": runs}  # fmt: skip


def figure4_report(results: list[dict[str, Any]]) -> str:
    head = results[0]
    lines = [
        "# FeDLRT least squares, the paper's Figure 4 setting",
        "",
        f"n = 20, rank-4 target, 10,000 points (data seed {head['data-seed']}), λ = 1e-3, "
        f"s* = 20, τ = 0.1, initial rank 10, {head['rounds']} rounds, {head['inits']} initial "
        "weights per client count; FeDLRT with simplified correction against FedLin. "
        "\"median\" columns are read off the per-round median over the initial weights (the "
        "paper's curves); the others count the runs.",
        "",
        "| C | median rank 4 from round | runs below rank 4 after reaching it | final ranks "
        "| FeDLRT median ‖W − W_r‖ < 1e-5 from round | FedLin the same | FeDLRT median "
        "‖W − W_r‖, last round | FedLin the same | FeDLRT median loss, last round "
        "| FedLin the same | seconds per run (FeDLRT, FedLin) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        med, runs = res["median"], res["runs"]
        rank_at = _first(med["fedlrt"]["rank"], lambda r: r <= 4)
        below = sum(1 for r in runs if r["min-rank-after"] is not None and r["min-rank-after"] < 4)
        ranks = sorted({r["final-rank"] for r in runs})
        lines.append(
            f"| {res['clients']} | {rank_at} | {below} of {len(runs)} | "
            f"{', '.join(map(str, ranks))} | "
            f"{_first(med['fedlrt']['distance'], lambda v: v < 1e-5) or 'never'} | "
            f"{_first(med['fedlin']['distance'], lambda v: v < 1e-5) or 'never'} | "
            f"{med['fedlrt']['distance'][-1]:.1e} | {med['fedlin']['distance'][-1]:.1e} | "
            f"{med['fedlrt']['loss'][-1]:.1e} | {med['fedlin']['loss'][-1]:.1e} | "
            f"{np.mean([r['fedlrt-seconds'] for r in runs]):.1f}, "
            f"{np.mean([r['fedlin-seconds'] for r in runs]):.1f} |"
        )
    lines += ["", "Rounds at which each run's ‖W − W_r‖ first fell below 1e-5 (median [min, max] "
              "over the runs that got there; how many did):", ""]  # fmt: skip
    lines += ["| C | FeDLRT | FedLin |", "|---|---|---|"]
    for res in results:
        cells = []
        for m in PAPER_METHODS:
            hits = [r[f"{m}-1e-5-at"] for r in res["runs"] if r[f"{m}-1e-5-at"] is not None]
            cells.append(
                f"{int(np.median(hits))} [{min(hits)}, {max(hits)}], {len(hits)} of "
                f"{len(res['runs'])}" if hits else f"none of {len(res['runs'])}"
            )
        lines.append(f"| {res['clients']} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        "How much faster FeDLRT gets where FedLin ends: the round at which FeDLRT's median loss "
        "(distance) first falls below FedLin's median after the last round:",
        "",
    ]
    lines += ["| C | FedLin's last median loss | FeDLRT below it from round | FedLin's last median "
              "‖W − W_r‖ | FeDLRT below it from round |", "|---|---|---|---|---|"]  # fmt: skip
    for res in results:
        med = res["median"]
        loss, dist = med["fedlin"]["loss"][-1], med["fedlin"]["distance"][-1]
        lines.append(
            f"| {res['clients']} | {loss:.1e} | "
            f"{_first(med['fedlrt']['loss'], lambda v, t=loss: v < t) or 'never'} | {dist:.2f} | "
            f"{_first(med['fedlrt']['distance'], lambda v, t=dist: v < t) or 'never'} |"
        )
    return "\n".join(lines) + "\n"


def figure4_plot(results: list[dict[str, Any]], out: Path) -> None:
    import matplotlib  # lazy: only the plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: only the plots need it

    fig, ax = plt.subplots(1, 4, figsize=(16, 3.5))
    for i, res in enumerate(results):
        med, label = res["median"], f"C = {res['clients']}"
        ax[0].plot(range(1, len(med["fedlrt"]["rank"]) + 1), med["fedlrt"]["rank"], color=f"C{i}",
                   label=label)  # fmt: skip
        ax[1].semilogy(med["fedlrt"]["distance"], color=f"C{i}", label=f"FeDLRT {label}")
        ax[1].semilogy(med["fedlin"]["distance"], color=f"C{i}", ls="--")
        ax[2].semilogy(med["fedlrt"]["loss"], color=f"C{i}", label=label)
        ax[3].semilogy(med["fedlin"]["loss"], color=f"C{i}", label=label)
    ax[0].set(xlabel="aggregation round", ylabel="rank", title="FeDLRT rank (median)")
    ax[1].set(xlabel="aggregation round", ylabel="‖W − W_r‖",
              title="distance (FeDLRT solid, FedLin dashed)")  # fmt: skip
    ax[2].set(xlabel="aggregation round", ylabel="global loss", title="FeDLRT loss (median)")
    ax[3].set(xlabel="aggregation round", ylabel="global loss", title="FedLin loss (median)")
    for a in ax:
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "figure4.png", dpi=110)


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
    parser.add_argument("--paper", action="store_true",
                        help="run the paper's Figure 4 setting instead of H1 and H2")  # fmt: skip
    parser.add_argument("--clients", type=int, nargs="+", default=list(PAPER_CLIENTS))
    parser.add_argument("--inits", type=int, default=20)
    parser.add_argument("--paper-rounds", type=int, default=1500)
    parser.add_argument("--tabulate", type=Path, nargs="+", default=[],
                        help="with --paper: tabulate and plot these figure4.json files together "
                        "instead of running")  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.paper:
        results = [r for path in args.tabulate for r in json.loads(path.read_text())]
        for count in [] if args.tabulate else args.clients:
            results.append(figure4(count, args.inits, args.paper_rounds))
            print(f"C = {count}: " + ", ".join(
                f"{m} median ‖W − W_r‖ {results[-1]['median'][m]['distance'][-1]:.1e}"
                for m in PAPER_METHODS), flush=True)  # fmt: skip
            (args.out / "figure4.json").write_text(json.dumps(results) + "\n")
        results.sort(key=lambda r: r["clients"])
        text = figure4_report(results)
        (args.out / "figure4.md").write_text(text)
        figure4_plot(results, args.out)
        print(text)
        return
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
