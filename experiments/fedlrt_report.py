"""Communication, ranks and accuracy of the runs of a FeDLRT experiment (after
`pollen experiment experiments/fedlrt_mnist.toml --out DIR`):

    python -m experiments.fedlrt_report DIR

writes DIR/traffic.md (per method: final accuracy, bytes per client and round measured from
the messages, saving against FedAvg, final ranks) and DIR/ranks.png (rank per round).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def runs(out: Path) -> dict[str, list[list[dict[str, Any]]]]:
    """method -> the metrics.jsonl rows of each of its seeds."""
    found: dict[str, list[list[dict[str, Any]]]] = {}
    for path in sorted(out.glob("*-seed*/metrics.jsonl")):
        method = path.parent.name.rpartition("-seed")[0]
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        found.setdefault(method, []).append(rows)
    return found


def per_client_bytes(row: dict[str, Any]) -> float:
    """Array bytes one client received and sent in the round (every phase)."""
    return (row["bytes-sent"] + row["bytes-received"]) / max(row["train"]["clients"], 1.0)


def summarize(found: dict[str, list[list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for method, seeds in found.items():
        last = [rows[-1] for rows in seeds]
        ranks = {
            k: [r["train"][k] for r in last] for k in last[0]["train"] if k.startswith("rank-")
        }
        table[method] = {
            "accuracy": statistics.fmean(r["server-eval"]["test-accuracy"] for r in last),
            "bytes": statistics.fmean(per_client_bytes(r) for rows in seeds for r in rows),
            "ranks": {k: statistics.fmean(v) for k, v in ranks.items()},
            "rounds": len(seeds[0]),
            "seeds": len(seeds),
        }
    for baseline in ("fedavg", "fedlin"):
        base = table.get(baseline, {}).get("bytes")
        for stats in table.values():
            stats[f"saving-{baseline}"] = 1 - stats["bytes"] / base if base else None
    return table


def markdown(table: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| method | server test accuracy (%) | MB per client and round | saving vs FedAvg "
        "| saving vs FedLin | final ranks |",
        "|---|---|---|---|---|---|",
    ]
    for method, s in table.items():
        savings = [
            "–" if s[f"saving-{b}"] is None else f"{100 * s[f'saving-{b}']:.0f}%"
            for b in ("fedavg", "fedlin")
        ]
        ranks = ", ".join(f"{k.removeprefix('rank-')}: {v:.0f}" for k, v in s["ranks"].items())
        lines.append(
            f"| {method} | {100 * s['accuracy']:.1f} | {s['bytes'] / 1e6:.3f} | "
            f"{' | '.join(savings)} | {ranks or 'full'} |"
        )
    return "\n".join(lines) + "\n"


def plot(found: dict[str, list[list[dict[str, Any]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    for i, (method, seeds) in enumerate(found.items()):
        rows = seeds[0]
        rounds = [r["round"] for r in rows]
        ax[1].plot(rounds, [r["server-eval"]["test-accuracy"] for r in rows], f"C{i}",
                   label=method)  # fmt: skip
        for j, key in enumerate(k for k in rows[0]["train"] if k.startswith("rank-")):
            ax[0].plot(rounds, [r["train"][key] for r in rows], f"C{i}", ls=("-", "--")[j % 2],
                       label=f"{method} {key.removeprefix('rank-')}")  # fmt: skip
    ax[0].set(xlabel="round", ylabel="rank", title="rank per low-rank layer")
    ax[1].set(xlabel="round", ylabel="server test accuracy", title="accuracy")
    if ax[0].get_legend_handles_labels()[0]:
        ax[0].legend(fontsize=6)
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    found = runs(args.out)
    if not found:
        raise SystemExit(f"no runs under {args.out}")
    text = markdown(summarize(found))
    (args.out / "traffic.md").write_text(text)
    plot(found, args.out / "ranks.png")
    print(text)


if __name__ == "__main__":
    main()
