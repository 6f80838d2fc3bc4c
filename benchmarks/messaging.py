"""Messaging benchmark: what one exchange costs in deployment and in simulation, how long a
ClientApp takes to start, and how many bytes a client moves per round.

Runs `pollen deploy` / `pollen simulate` for the no-op algorithm (Flower's own floor: nothing
but messaging) and for FedAvg, then times ClientApp start-up pieces in fresh interpreters.
Prints a table and writes JSON (default: pollen-bench/messaging.json in the system's temporary
directory).

    .venv/bin/python benchmarks/messaging.py [--rounds 4] [--clients 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pollen.core import rundir

ROOT = Path(__file__).resolve().parent.parent


def _pollen(args: list[str], cache: Path) -> None:
    env = dict(os.environ, POLLEN_CACHE_DIR=str(cache), FLWR_TELEMETRY_ENABLED="0")
    done = subprocess.run(
        [sys.executable, "-m", "pollen.tools.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"pollen {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


def _phases(out: Path) -> dict[str, list[dict[str, Any]]]:
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for row in rundir.read_rounds(out):
        for phase in row.phases:
            by_phase.setdefault(phase.phase, []).append(phase.to_json())
    return by_phase


def measure_runtime(
    mode: str, algorithm: str, rounds: int, clients: int, work: Path, cache: Path
) -> dict[str, Any]:
    out = work / f"{mode}-{algorithm}"
    started = time.monotonic()
    _pollen(
        [
            mode,
            "--algorithm",
            algorithm,
            "--dataset",
            "mnist-5k",
            "--clients",
            str(clients),
            "--rounds",
            str(rounds),
            "--out",
            str(out),
            "--set",
            "final-eval=false",
            "--set",
            "server-eval=false",
        ],
        cache,
    )
    wall = time.monotonic() - started
    phases = _phases(out)
    main = "query.noop" if algorithm == "noop" else "train"
    secs = [p["seconds"] for p in phases[main]]
    steady = secs[1:] if len(secs) > 1 else secs
    sent = [p["bytes-sent"] / max(p["sent"], 1) for p in phases[main]]
    received = [p["bytes-received"] / max(p["valid"], 1) for p in phases[main]]
    return {
        "mode": mode,
        "algorithm": algorithm,
        "rounds": rounds,
        "clients": clients,
        "wall-seconds": round(wall, 2),
        "seconds-per-exchange-first": round(secs[0], 3),
        "seconds-per-exchange-median": round(statistics.median(steady), 3),
        "seconds-per-exchange-all": secs,
        "hello-seconds": [p["seconds"] for p in phases.get("query.hello", [])],
        "bytes-to-client-per-round": int(statistics.mean(sent)),
        "bytes-from-client-per-round": int(statistics.mean(received)),
    }


STARTUP_SNIPPETS = {
    "python": "pass",
    "import flwr.clientapp (Flower's own)": "import flwr.clientapp",
    "import client.app (Pollen ClientApp)": "import client.app",
    "import torch": "import torch",
    "import flwr.clientapp, torch (floor of a torch ClientApp)": "import flwr.clientapp, torch",
    "hello handler, cached partition": "hello",
    "fedavg train handler, first message": "train",
    "fedavg train handler, no training (epochs 0)": "train-no-compute",
}
PROBES = ("hello", "train", "train-no-compute")


def measure_startup(cache: Path, repeats: int) -> dict[str, Any]:
    env = dict(os.environ, POLLEN_CACHE_DIR=str(cache), FLWR_TELEMETRY_ENABLED="0")
    times: dict[str, list[float]] = {label: [] for label in STARTUP_SNIPPETS}
    cpu: dict[str, list[float]] = {label: [] for label in STARTUP_SNIPPETS}
    for _ in range(repeats):  # interleaved, so that a change of machine load hits every probe
        for label, code in STARTUP_SNIPPETS.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            argv = (
                [sys.executable, str(ROOT / "benchmarks" / "startup_probe.py"), code]
                if code in PROBES
                else [sys.executable, "-c", code]
            )
            subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)
            times[label].append(time.monotonic() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[label].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return {
        label: {
            "wall": round(statistics.median(times[label]), 3),
            "cpu": round(statistics.median(cpu[label]), 3),
        }
        for label in STARTUP_SNIPPETS
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="deploy,simulate")
    scratch = Path(tempfile.gettempdir()) / "pollen-bench" / "messaging.json"
    parser.add_argument("--out", default=str(scratch))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pollen-bench-"))
    cache = work / "cache"
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "startup-seconds": {},
        "runtimes": [],
    }
    for mode in args.modes.split(","):
        for algorithm in ("noop", "fedavg"):
            row = measure_runtime(mode, algorithm, args.rounds, args.clients, work, cache)
            report["runtimes"].append(row)
            print(
                f"{mode:9s} {algorithm:7s} first {row['seconds-per-exchange-first']:6.2f} s  "
                f"median {row['seconds-per-exchange-median']:6.2f} s per exchange  "
                f"{row['bytes-to-client-per-round']:>9d} B down "
                f"{row['bytes-from-client-per-round']:>9d} B up per client per round",
                flush=True,
            )
    report["startup-seconds"] = measure_startup(cache, args.repeats)
    for label, secs in report["startup-seconds"].items():
        print(f"start-up  {label:40s} {secs['wall']:6.3f} s wall {secs['cpu']:6.3f} s CPU")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
