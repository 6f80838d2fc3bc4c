"""FedEM's cost as M grows: seconds per round and bytes per client per round (M models travel
each way), for M = 1, 2, 3, on the Flower simulation runtime with embedded MNIST.

    .venv/bin/python benchmarks/fedem_components.py [--rounds 4] [--clients 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pollen.core import rundir

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--mode", default="simulate", choices=("simulate", "deploy"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fedem.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pollen-fedem-bench-"))
    env = dict(os.environ, POLLEN_CACHE_DIR=str(work / "cache"), FLWR_TELEMETRY_ENABLED="0")
    rows = []
    for m in (1, 2, 3):
        out = work / f"m{m}"
        argv = [
            sys.executable,
            "-m",
            "pollen.tools.cli",
            args.mode,
            "--algorithm",
            "fedem",
            "--dataset",
            "mnist-5k",
            "--clients",
            str(args.clients),
            "--rounds",
            str(args.rounds),
            "--out",
            str(out),
            "--set",
            f"fedem.components={m}",
            "--set",
            "final-eval=false",
            "--set",
            "server-eval=false",
        ]
        subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)
        metrics = rundir.read_rounds(out)
        steady = metrics[1:] or metrics
        train = [p for r in steady for p in r.phases if p.phase == "train"]
        row = {
            "components": m,
            "seconds-per-round-median": round(statistics.median(r.seconds for r in steady), 3),
            "bytes-to-client-per-round": int(
                statistics.mean(p.bytes_sent / p.sent for p in train)
            ),
            "bytes-from-client-per-round": int(
                statistics.mean(p.bytes_received / p.valid for p in train)
            ),
        }
        rows.append(row)
        print(
            f"M={m}: {row['seconds-per-round-median']:.2f} s per round, "
            f"{row['bytes-to-client-per-round']:,} B down and "
            f"{row['bytes-from-client-per-round']:,} B up per client per round",
            flush=True,
        )
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "mode": args.mode,
        "clients": args.clients,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
