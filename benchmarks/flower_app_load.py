"""A user's Flower app on a loaded machine: examples/quickstart-pytorch switched to FeDLRT by its
patch, run with `flwr run` on a simulation SuperLink while `--busy` processes spin on the CPUs,
once with the server's BLAS at the library's default threads (`server-blas-threads=0`) and once
capped at one (the default), back to back. Prints and writes (JSON, `--out`) the seconds of the
strategy (`Strategy execution finished in ...`) and of the whole `flwr run`, and the 1-minute
load average when each run started.

    .venv/bin/python benchmarks/flower_app_load.py [--busy 8] [--rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pollen.tools.local_federation import LocalFederation  # noqa: E402

EXAMPLE = ROOT / "examples" / "quickstart-pytorch"


def spin() -> None:
    while True:
        pass


def run(app: Path, work: Path, rounds: int, threads: int, limit: float) -> dict[str, Any]:
    fed = LocalFederation(work)
    fed.env.update(RAY_ADDRESS="local", FLWR_TELEMETRY_ENABLED="0")
    load = os.getloadavg()[0]
    started = time.monotonic()
    status: dict[str, Any] = {}
    try:
        fed.start_superlink(simulation=True)
        fed.configure_simulation(2, 1)
        config = {"num-server-rounds": rounds, "lr": 0.05, "server-blas-threads": threads}
        run_id = fed.submit(config, app=app)
        while time.monotonic() - started < limit:
            status = fed.run_status(run_id)
            if str(status.get("status", "")).startswith("finished"):
                break
            time.sleep(2)
        seconds = time.monotonic() - started
        log = fed.server_log(run_id)
    finally:
        fed.stop()
    found = re.search(r"Strategy execution finished in ([0-9.]+)s", log)
    return {
        "server-blas-threads": threads,
        "status": status.get("status", f"not finished after {limit:.0f} s"),
        "strategy-seconds": float(found.group(1)) if found else None,
        "run-seconds": round(seconds, 1),
        "load-1min-at-start": round(load, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=8, help="processes spinning meanwhile")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--threads", type=lambda v: [int(t) for t in v.split(",")], default=[0, 1],
        help="server-blas-threads of each run",
    )  # fmt: skip
    parser.add_argument("--limit", type=float, default=600.0, help="seconds a run may take")
    parser.add_argument(
        "--out", type=Path, default=Path(tempfile.gettempdir()) / "flower_app_load.json"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "app"
        shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("variants", "__pycache__"))
        patch = (EXAMPLE / "variants" / "fedlrt.patch").read_text()
        subprocess.run(["git", "apply", "-p1", "-"], input=patch, cwd=app, text=True, check=True)
        project = app / "pyproject.toml"  # a run config sets only keys the app declares
        project.write_text(project.read_text() + "server-blas-threads = 1\n")
        busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
        for proc in busy:
            proc.start()
        try:
            time.sleep(20)  # let the load average rise
            rows = [
                run(app, Path(tmp) / f"t{t}", args.rounds, t, args.limit) for t in args.threads
            ]
        finally:
            for proc in busy:
                proc.terminate()
    result = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "busy": args.busy,
              "rounds": args.rounds, "runs": rows}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for row in rows:
        print(row)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
