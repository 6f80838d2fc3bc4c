"""Rounds that do not wait for the slowest device (docs/results/pacing.md): synchronous rounds
against deadline rounds with over-selection and against buffered asynchronous aggregation
(FedBuff), for FedAvg and FedEM on `mnist-5k` with 100
simulated clients of which 20 % are 10 times slower in compute and link (`heterogeneity.profile
= tiers`), on the virtual clock, three seeds; and the time each run takes to reach the
synchronous run's final accuracy. `--profile phones` runs the same grid with devices drawn
from published measurements of Android phones instead (docs/pacing.md#devices: AI Benchmark's
CPU scores, measured WiFi bandwidths), nothing else changed.

    python -m experiments.pacing run --out DIR [--algorithms fedavg,fedem] [--seeds 0,1,2]
        [--modes sync,deadline,fedbuff] [--clients 100] [--profile tiers]
    python -m experiments.pacing tabulate DIR
    python -m experiments.pacing deploy --out DIR [--rounds 4] [--deadline S]
        [--modes sync,deadline] [--bandwidth MBPS]

`deploy` runs a deployed federation of 16 SuperNodes on this machine (`pollen deploy`, gRPC),
3 of them ten times slower (`tiers`, slow-fraction 3/16, on the wall clock: their clients wait
out what their devices add), synchronous and with `round.deadline` DEPLOY_DEADLINE, the fast
devices' link at `--bandwidth` Mbit/s (20; the slow ones' a tenth), and writes each run's
round seconds and final accuracy to DIR/deploy.json.

Every run is one federation through the real ServerApp and ClientApp in one process
(server.local_grid, as experiments/robustness.py runs them); on the virtual clock its times do
not depend on the machine. A round samples 10 % of the clients. The deadline runs sample 30 %
more (`round.over-selection` = 0.3, Bonawitz et al. 2019's 130 %), keep the first 10 % that
answer, and close a phase at DEADLINE virtual seconds (by algorithm) at the latest. The FedBuff
runs keep twice that count of clients training (`async.concurrency` 20 of 100, 200 of 1,000)
and make a model version of every 10 (100) valid replies (`async.buffer`), with the paper's
staleness weight 1/sqrt(1 + s), server learning rate 1 and replies more than 10 versions old
dropped (the defaults). Deadline and FedBuff runs make twice the rounds (versions) so that the
table can say when they reach the synchronous run's final accuracy. The accuracy
is the server's evaluation of the global model after each round (FedEM: its mixture's
components averaged by the clients' mean weights is not one model; its per-round figure is the
clients' own test accuracy, `train/test-accuracy`, measured on the model each received).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.robustness import grid_cli, names, rows, run

BASE: dict[str, Any] = {
    "dataset": "mnist-5k",
    "model": "mlp",
    "num-clients": 100,
    "num-rounds": 30,
    "lr": 0.1,
    "batch-size": 16,
    "fraction-train": 0.1,
    "phase-timeout": 600.0,
    "wait-for-clients": 5.0,
    "poll-interval": 0.01,
    "heterogeneity.profile": "tiers",
    "heterogeneity.clock": "virtual",
    "heterogeneity.slow-fraction": 0.2,
    "heterogeneity.slowdown": 10.0,
}
DEADLINE = {"fedavg": 2.0, "fedem": 6.0}
"""round.deadline of the deadline runs, in virtual seconds, between a fast device's time for a
round of the algorithm on this model and data and a slow one's (ten times that): FedAvg's fast
device takes about 0.6 s (35 examples at 5 ms, the model down and up at 20 Mbit/s, 50 ms each
way), FedEM's about three times that (three components trained and sent). FedEM's first
deadline, FedAvg's 2 s, was below its fast devices' time: every round stopped with no valid
reply (docs/results/pacing.md)."""
OVER_SELECTION = 0.3
MODES: dict[str, dict[str, Any]] = {
    "sync": {},
    "deadline": {"round.over-selection": OVER_SELECTION},
    "fedbuff": {},
}
LONGER = {"deadline": 2, "fedbuff": 2}
"""Modes that run this many times the rounds (a round of theirs costs a fraction of a
synchronous one's time)."""
ALGORITHM: dict[str, dict[str, Any]] = {
    "fedavg": {"algorithm": "fedavg"},
    "fedem": {"algorithm": "fedem", "fedem.aggregation": "renormalize"},
}
"""FedEM averages the clients it sampled ('renormalize'): its default ('stale', the reference
code's) moves the components by the sampled clients' share of the pool only, a tenth of a step
here, which FedBuff's step (server-lr 1) does not do; the three modes then take the same step."""
PROFILES: dict[str, dict[str, Any]] = {
    "tiers": {},
    "phones": {"heterogeneity.profile": "phones"},
}
"""The device profiles the grid runs on: BASE's tiers, or the measured phones (their link drawn
from the WiFi tests; 5 ms an example for the median phone, 50 ms latency)."""
PER_ROUND = {"fedavg": ("server-eval", "test-accuracy"), "fedem": ("train", "test-accuracy")}
"""The per-round accuracy each algorithm's time-to-accuracy reads (module docstring)."""


@dataclass(frozen=True)
class Case:
    algorithm: str
    mode: str
    clients: int
    seed: int
    profile: str = "tiers"

    @property
    def name(self) -> str:
        devices = "" if self.profile == "tiers" else f"-{self.profile}"
        return f"{self.algorithm}-{self.mode}-n{self.clients}-s{self.seed}{devices}"

    def settings(self, out: Path, cache: Path) -> dict[str, Any]:
        cfg = {**BASE, **MODES[self.mode], **ALGORITHM[self.algorithm], "seed": self.seed}
        cfg.update(PROFILES[self.profile])
        if self.mode == "deadline":
            cfg["round.deadline"] = DEADLINE[self.algorithm]
        if self.mode == "fedbuff":  # a buffer of a synchronous round's count, twice as many busy
            wanted = round(BASE["fraction-train"] * self.clients)
            cfg.update({"async.buffer": wanted, "async.concurrency": 2 * wanted})
        cfg["num-clients"] = self.clients
        cfg["num-rounds"] = BASE["num-rounds"] * LONGER.get(self.mode, 1)
        cfg.update(
            {
                "out-dir": str(out / "runs" / self.name),
                "run-name": self.name,
                "cache-dir": str(cache),
                "client-state-dir": str(out / "state"),
            }
        )
        return cfg


def cases(
    algorithms: Iterable[str],
    modes: Iterable[str],
    clients: Iterable[int],
    seeds: Iterable[int],
    profile: str = "tiers",
) -> list[Case]:
    return [
        Case(a, m, n, s, profile)
        for a in algorithms
        for n in clients
        for s in seeds
        for m in modes
    ]


def curve(out: Path, name: str, algorithm: str) -> list[tuple[int, float, float]]:
    """(round, time at its end, accuracy) of each round of a run."""
    part, key = PER_ROUND[algorithm]
    path = out / "runs" / name / "metrics.jsonl"
    points = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        value = (row.get(part) or {}).get(key)
        if value is not None and row.get("time") is not None:
            points.append((int(row["round"]), float(row["time"]), float(value)))
    return points


def reached(points: list[tuple[int, float, float]], accuracy: float) -> tuple[int, float] | None:
    """The first (round, time) at which a curve reaches `accuracy`."""
    return next(((r, t) for r, t, a in points if a >= accuracy), None)


def summarise(out: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (algorithm, clients, seed): the synchronous run's final accuracy and time, and for
    every mode the time and round at which it reaches that accuracy (and its ratio to the
    synchronous time), its own final accuracy at the synchronous run's round count, and its
    late replies."""
    by = {r["name"]: r for r in results if r.get("status") == "completed"}
    table: dict[str, Any] = {}
    for r in by.values():
        c = r["case"]
        if c["mode"] != "sync":
            continue
        alg = c["algorithm"]
        profile = c.get("profile", "tiers")
        sync = curve(out, r["name"], alg)
        target = sync[-1][2]
        cell: dict[str, Any] = {"sync-accuracy": target, "sync-time": sync[-1][1], "modes": {}}
        for mode in MODES:
            name = Case(alg, mode, c["clients"], c["seed"], profile).name
            if name not in by:
                continue
            points = curve(out, name, alg)
            hit = reached(points, target)
            same = [p for p in points if p[0] <= len(sync)]
            late = sum(
                int(json.loads(line).get("late", 0))
                for line in (out / "runs" / name / "metrics.jsonl").read_text().splitlines()
            )
            cell["modes"][mode] = {
                "reached-round": hit[0] if hit else None,
                "reached-time": round(hit[1], 2) if hit else None,
                "time-ratio": round(hit[1] / sync[-1][1], 3) if hit else None,
                "accuracy-at-sync-rounds": same[-1][2] if same else None,
                "time-at-sync-rounds": round(same[-1][1], 2) if same else None,
                "late": late,
                "seconds": r["seconds"] if mode == "sync" else by[name]["seconds"],
            }
        devices = "" if profile == "tiers" else f"/{profile}"
        table[f"{alg}/n{c['clients']}/s{c['seed']}{devices}"] = cell
    return dict(sorted(table.items()))


def markdown(table: Mapping[str, Any]) -> str:
    lines = [
        "| run | sync: final accuracy, virtual s | mode | reaches it at round, virtual s "
        "(ratio) | accuracy after the sync run's rounds, at virtual s | late replies "
        "| wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, cell in table.items():
        for mode, m in cell["modes"].items():
            hit = (
                f"{m['reached-round']}, {m['reached-time']:.1f} ({m['time-ratio']:.3f})"
                if m["reached-round"] is not None
                else "not reached"
            )
            same = m["accuracy-at-sync-rounds"]
            lines.append(
                f"| {key} | {cell['sync-accuracy']:.4f}, {cell['sync-time']:.1f} | {mode} | "
                f"{hit} | {same:.4f}, {m['time-at-sync-rounds']:.1f} | {m['late']} | "
                f"{m['seconds']:.0f} |"
            )
    return "\n".join(lines) + "\n"


DEPLOY: dict[str, Any] = {
    "num-clients": 16, "dataset": "mnist-5k", "lr": 0.1, "batch-size": 16,
    "heterogeneity.profile": "tiers", "heterogeneity.slow-fraction": 3 / 16,
    "heterogeneity.slowdown": 10.0, "poll-interval": 0.5,
}  # fmt: skip
DEPLOY_DEADLINE = 45.0
"""Seconds: above the 34 s a warm round of 16 deployed SuperNodes takes on this 2-core machine
(docs/performance.md), fixed before the runs."""


def deploy(
    out: Path,
    rounds: int,
    deadline: float = DEPLOY_DEADLINE,
    modes: tuple[str, ...] = (),
    bandwidth: float = 20.0,
) -> dict[str, Any]:
    """The deployed pair (module docstring), one after the other (or the `modes` of it), the
    fast devices' link at `bandwidth` Mbit/s (the slow ones' a tenth of it); their figures,
    added to DIR/deploy.json's."""
    import subprocess
    import sys

    out.mkdir(parents=True, exist_ok=True)
    saved = out / "deploy.json"
    figures: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() else {}
    pair = {"sync": {}, f"deadline-{deadline:g}": {"round.deadline": deadline}}
    for mode, extra in pair.items():
        if modes and mode.split("-")[0] not in modes:
            continue
        run = out / f"deploy-{mode}"
        link = {"heterogeneity.bandwidth-mbps": bandwidth}
        sets = [f"--set={k}={v}" for k, v in {**DEPLOY, **link, **extra}.items()]
        argv = [sys.executable, "-m", "pollen.tools.cli", "deploy", "--algorithm", "fedavg",
                "--rounds", str(rounds), *sets, "--out", str(run), "--plain"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=7200)
        summary = json.loads((run / "summary.json").read_text())
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
        final = (summary.get("final") or {}).get("eval", {})
        figures[mode] = {
            "status": summary["status"], "exit-code": done.returncode, "bandwidth-mbps": bandwidth,
            "round-seconds": [r["seconds"] for r in rows],
            "late": [r.get("late", 0) for r in rows],
            "final-accuracy": final.get("test-accuracy"),
            "server-accuracy": [(r.get("server-eval") or {}).get("test-accuracy") for r in rows],
        }  # fmt: skip
        print(mode, json.dumps(figures[mode]), flush=True)
    sync = figures.get("sync", {}).get("round-seconds")
    for mode, run_figures in figures.items():
        paced = run_figures.get("round-seconds") if isinstance(run_figures, dict) else None
        if mode.startswith("deadline") and sync and paced:
            run_figures["ratio-of-mean-round-seconds"] = round(
                (sum(paced) / len(paced)) / (sum(sync) / len(sync)), 3
            )
    saved.write_text(json.dumps(figures, indent=1))
    return figures


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        import sys

        argv = sys.argv[1:]
    if argv[:1] == ["deploy"]:
        import argparse

        d = argparse.ArgumentParser(description="the deployed pair of runs")
        d.add_argument("--out", type=Path, required=True)
        d.add_argument("--rounds", type=int, default=4)
        d.add_argument("--deadline", type=float, default=DEPLOY_DEADLINE)
        d.add_argument("--modes", default="sync,deadline")
        d.add_argument("--bandwidth", type=float, default=20.0)
        args = d.parse_args(argv[1:])
        modes = tuple(names(args.modes))
        figures = deploy(args.out, args.rounds, args.deadline, modes, args.bandwidth)
        print(json.dumps(figures, indent=1))
        return 0
    parser, p = grid_cli(__doc__ or "")
    p.add_argument("--algorithms", default="fedavg,fedem")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--clients", default="100")
    p.add_argument("--profile", choices=tuple(PROFILES), default="tiers")
    args = parser.parse_args(argv)
    if args.command == "run":
        todo = cases(
            names(args.algorithms),
            names(args.modes),
            [int(x) for x in names(args.clients)],
            [int(x) for x in names(args.seeds)],
            args.profile,
        )
        run(todo, args.out, args.jobs)
        return 0
    table = summarise(args.out, rows(args.out))
    (args.out / "pacing.json").write_text(json.dumps(table, indent=1, sort_keys=True))
    text = markdown(table)
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
