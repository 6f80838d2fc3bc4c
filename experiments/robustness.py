"""Robust aggregation under attack, as the field evaluates it (docs/results/robustness.md):
n = 10 honest clients plus f in {0, 1, 2, 3} Byzantine ones on `digits`, heterogeneity IID /
Dirichlet 0.5 / Dirichlet 0.1, every attack, three seeds; for each rule the clean accuracy and
the worst case over attacks (ByzFL's protocol: Allouah et al., AISTATS 2023, Sec. 6).

    python -m experiments.robustness run --out DIR [--algorithms fedavg,fedem] [--f 0,2] ...
    python -m experiments.robustness tabulate DIR

Every run is one federation through the real ServerApp and ClientApp in one process
(server.local_grid); `--jobs` runs that many at once. Runs already in DIR/results.jsonl are
skipped, so a grid can be run in parts. The rules are sized for the attackers present
(robust.f = f); a clean run (f = 0) sizes them for CLEAN_F attackers that never come, the
cost of deploying the rule. No hyper-parameter is tuned: every rule runs with its
parameter-free default (centered-clip's radius is the median distance, the adaptive clipping
bound the median norm), so nothing is chosen on the test split.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pollen.core import rundir
from pollen.core.protection import ATTACKS

RULES: dict[str, dict[str, Any]] = {
    "mean": {"robust.rule": "mean"},
    "clip": {"robust.rule": "mean", "robust.clip-quantile": 0.5},
    "median": {"robust.rule": "median"},
    "trimmed-mean": {"robust.rule": "trimmed-mean"},
    "krum": {"robust.rule": "krum"},
    "multi-krum": {"robust.rule": "multi-krum"},
    "geomed": {"robust.rule": "geomed"},
    "centered-clip": {"robust.rule": "centered-clip"},
    "nnm-trimmed-mean": {"robust.rule": "trimmed-mean", "robust.nnm": True},
}
"""The configurations compared: each rule alone, norm clipping at the median norm before the
mean ('clip'), and nearest-neighbour mixing before the trimmed mean ('nnm-trimmed-mean', the
recommended default: Allouah et al. 2023)."""
PARTITIONS: dict[str, dict[str, Any]] = {
    "iid": {"partitioner": "iid"},
    "dir0.5": {"partitioner": "dirichlet", "dirichlet-alpha": 0.5},
    "dir0.1": {"partitioner": "dirichlet", "dirichlet-alpha": 0.1},
}
HONEST = 10
CLEAN_F = 2
BASE: dict[str, Any] = {
    "dataset": "digits",
    "model": "mlp",
    "num-rounds": 8,
    "lr": 0.1,
    "batch-size": 16,
    "server-eval": False,
    "phase-timeout": 600.0,
    "wait-for-clients": 5.0,
    "poll-interval": 0.01,
}
ALGORITHM: dict[str, dict[str, Any]] = {
    "fedavg": {"algorithm": "fedavg"},
    "fedem": {"algorithm": "fedem"},
    "fedlrt": {"algorithm": "fedlrt"},
}


class Federation(Protocol):
    """One run of a grid (this module's Case, experiments.client_dp's): its name, its
    settings and, as the row's `case`, its fields."""

    @property
    def name(self) -> str: ...

    def settings(self, out: Path, cache: Path) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Case:
    algorithm: str
    partition: str
    f: int
    attack: str  # "none" when f == 0
    rule: str
    seed: int
    size: int | None = None
    """robust.f the rules are sized for when it is not the number of attackers (a rule sized
    too small, to show where it breaks)."""

    @property
    def name(self) -> str:
        sized = f"-size{self.size}" if self.size is not None else ""
        return (
            f"{self.algorithm}-{self.partition}-f{self.f}-{self.attack}-{self.rule}{sized}"
            f"-s{self.seed}"
        )

    def settings(self, out: Path, cache: Path) -> dict[str, Any]:
        cfg = {
            **BASE,
            **ALGORITHM[self.algorithm],
            **PARTITIONS[self.partition],
            **RULES[self.rule],
        }
        cfg.update(
            {
                "num-clients": HONEST + self.f,
                "seed": self.seed,
                "out-dir": str(out / "runs" / self.name),
                "run-name": self.name,
                "cache-dir": str(cache),
                "client-state-dir": str(out / "state"),
            }
        )
        if self.rule != "mean":
            cfg["robust.f"] = self.size if self.size is not None else (self.f or CLEAN_F)
        if self.f:
            cfg["attack.clients"] = f"{HONEST}-{HONEST + self.f - 1}"
            cfg["attack.kind"] = self.attack
        return cfg


def cases(
    algorithms: Iterable[str],
    partitions: Iterable[str],
    fs: Iterable[int],
    attacks: Iterable[str],
    rules: Iterable[str],
    seeds: Iterable[int],
    size: int | None = None,
) -> list[Case]:
    out = []
    for a in algorithms:
        for p in partitions:
            for f in fs:
                for r in rules:
                    for s in seeds:
                        for k in attacks if f else ("none",):
                            out.append(Case(a, p, f, k, r, s, size))
    return out


def run_case(case: Federation, out: Path, cache: Path) -> dict[str, Any]:
    """One federation in this process; its result row (the final mean client test accuracy,
    or the reason it failed)."""
    import shutil

    import torch
    from flwr.app import Context, RecordDict

    from client.app import app as client_app
    from pollen.core.runconfig import resolve
    from server.app import app as server_app
    from server.local_grid import LocalGrid, task_identity

    torch.set_num_threads(1)
    settings = dict(resolve(case.settings(out, cache)))
    run_dir = Path(str(settings["out-dir"]))
    shutil.rmtree(run_dir, ignore_errors=True)
    grid = LocalGrid(client_app, int(settings["num-clients"]), settings)
    started = time.perf_counter()
    row: dict[str, Any] = {"case": case.__dict__, "name": case.name}
    try:
        with task_identity():
            server_app(grid, Context(1, 0, {}, RecordDict(), settings))
    except Exception as exc:  # a run that fails is a result too (the rule broke)
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    summary = rundir.read_summary(run_dir)
    row["seconds"] = round(time.perf_counter() - started, 2)
    final = summary.final.eval if summary is not None and summary.final else {}
    row["accuracy"] = final.get("test-accuracy")
    row["status"] = summary.status if summary is not None else None
    shutil.rmtree(out / "state" / case.name, ignore_errors=True)
    return row


def done(out: Path) -> set[str]:
    path = out / "results.jsonl"
    if not path.exists():
        return set()
    return {json.loads(line)["name"] for line in path.read_text().splitlines() if line.strip()}


def run(todo: Sequence[Federation], out: Path, jobs: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    finished = done(out)
    todo = [c for c in todo if c.name not in finished]
    print(f"{len(todo)} runs to do ({len(finished)} done)", flush=True)
    with (
        ProcessPoolExecutor(max_workers=jobs) as pool,
        (out / "results.jsonl").open("a") as sink,
    ):
        futures = {pool.submit(run_case, c, out, cache): c for c in todo}
        for i, fut in enumerate(as_completed(futures), 1):
            row = fut.result()
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            acc = row["accuracy"]
            shown = f"{acc:.3f}" if acc is not None else row.get("error", "-")
            print(f"[{i}/{len(todo)}] {row['name']}: {shown} ({row['seconds']} s)", flush=True)


def rows(out: Path) -> list[dict[str, Any]]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (algorithm, partition, f, rule): the accuracy averaged over seeds for each attack
    (a failed run counts as accuracy 0: the model is lost), the worst case over attacks and
    the attack reaching it; f = 0: the clean accuracy."""
    by: dict[tuple[str, str, int, str, str], list[float]] = {}
    for r in results:
        c = r["case"]
        acc = r["accuracy"] if r.get("status") == "completed" and r["accuracy"] is not None else 0.0
        rule = c["rule"] + (f" sized f={c['size']}" if c.get("size") is not None else "")
        key = (c["algorithm"], c["partition"], c["f"], rule, c["attack"])
        by.setdefault(key, []).append(float(acc))
    table: dict[str, Any] = {}
    for (alg, part, f, rule, attack), accs in sorted(by.items()):
        cell = table.setdefault(f"{alg}/{part}/f{f}/{rule}", {"attacks": {}, "seeds": len(accs)})
        cell["attacks"][attack] = round(_mean(accs), 4)
        cell["seeds"] = min(cell["seeds"], len(accs))
    for cell in table.values():
        attacks: Mapping[str, float] = cell["attacks"]
        worst = min(attacks, key=lambda k: attacks[k])
        cell["worst"] = attacks[worst]
        cell["worst-attack"] = worst
    return table


def markdown(table: Mapping[str, Any]) -> str:
    """One table per (algorithm, partition): rules down, clean and worst case per f across."""
    groups: dict[tuple[str, str], dict[str, dict[int, Any]]] = {}
    for key, cell in table.items():
        alg, part, size, rule = key.split("/")
        groups.setdefault((alg, part), {}).setdefault(rule, {})[int(size[1:])] = cell
    lines: list[str] = []
    for (alg, part), by_rule in groups.items():
        fs = sorted({f for cells in by_rule.values() for f in cells})
        lines += [f"### {alg}, {part}", ""]
        head = "| rule | " + " | ".join("clean" if f == 0 else f"f={f} worst (attack)" for f in fs)
        lines += [head + " | seeds |", "|---" * (len(fs) + 2) + "|"]
        for rule in sorted(by_rule, key=lambda r: (list(RULES).index(r.split()[0]), r)):
            cells = []
            for f in fs:
                cell = by_rule[rule].get(f)
                if cell is None:
                    cells.append("")
                elif f == 0:
                    cells.append(f"{cell['worst']:.3f}")
                else:
                    cells.append(f"{cell['worst']:.3f} ({cell['worst-attack']})")
            seeds = sorted({c["seeds"] for c in by_rule[rule].values()})
            lines.append(f"| {rule} | " + " | ".join(cells) + f" | {'/'.join(map(str, seeds))} |")
        lines.append("")
    return "\n".join(lines)


def figure(table: Mapping[str, Any], path: Path) -> None:
    """Worst case over attacks against f, one panel per (algorithm, partition), a line per
    rule (f = 0: clean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    for key, cell in table.items():
        alg, part, size, rule = key.split("/")
        if rule not in RULES:  # a rule sized below the attackers: in the tables only
            continue
        panels.setdefault((alg, part), {}).setdefault(rule, {})[int(size[1:])] = cell["worst"]
    names = sorted(panels)
    colour = {rule: plt.get_cmap("tab10")(i) for i, rule in enumerate(RULES)}
    cols = min(3, len(names))
    rows_ = -(-len(names) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(4.2 * cols, 3.4 * rows_), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for rule in RULES:
            points = panels[name].get(rule)
            if not points:
                continue
            fs = sorted(points)
            ax.plot(fs, [points[f] for f in fs], marker="o", color=colour[rule], label=rule)
        ax.set_title(f"{name[0]}, {name[1]}")
        ax.set_xlabel("attackers f (10 honest)")
        ax.set_ylabel("worst-case test accuracy")
        ax.set_xticks(range(4))
        ax.set_ylim(0, 1)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    handles = [plt.Line2D([], [], color=colour[r], marker="o", label=r) for r in RULES]
    fig.legend(handles=handles, loc="lower right", fontsize=9, title="rule (f = 0: clean)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def grid_cli(doc: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """An experiment's command line: `run --out DIR [--seeds] [--jobs]` (the caller adds its
    grid's options to the second parser returned) and `tabulate DIR`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run (the missing part of) a grid")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    t = sub.add_parser("tabulate", help="table, JSON and figure of what DIR holds")
    t.add_argument("out", type=Path)
    return parser, p


def names(text: str) -> list[str]:
    """A comma-separated option's items."""
    return [x for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser, p = grid_cli(__doc__)
    p.add_argument("--algorithms", default="fedavg,fedem,fedlrt")
    p.add_argument("--partitions", default=",".join(PARTITIONS))
    p.add_argument("--f", default="0,1,2,3")
    p.add_argument("--attacks", default=",".join(ATTACKS))
    p.add_argument("--rules", default=",".join(RULES))
    p.add_argument("--size", type=int, help="robust.f of the rules (default: the attackers)")
    args = parser.parse_args(argv)
    if args.command == "run":
        split = names
        todo = cases(
            split(args.algorithms),
            split(args.partitions),
            [int(x) for x in split(args.f)],
            split(args.attacks),
            split(args.rules),
            [int(x) for x in split(args.seeds)],
            args.size,
        )
        run(todo, args.out, args.jobs)
        return 0
    table = summarise(rows(args.out))
    (args.out / "robustness.json").write_text(json.dumps(table, indent=1, sort_keys=True))
    text = markdown(table)
    (args.out / "table.md").write_text(text)
    figure(table, args.out / "robustness.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
