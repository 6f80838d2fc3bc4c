"""Every registered algorithm for one round on CUDA and on the CPU, in simulation and in
deployment (2 clients, embedded data), with the seconds of the round for each
(docs/deployment.md#gpu). Run by scripts/gpu-check.sh:

    scripts/gpu-check.sh                          # every algorithm, both modes
    scripts/gpu-check.sh --algorithms fedavg,fedem --modes simulate --amp

On a machine where torch sees no CUDA GPU it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pollen.core import rundir

ROOT = Path(__file__).resolve().parents[1]
SETTINGS: dict[str, dict[str, Any]] = {
    # ADEPT-PCA needs its generated data (mnist-5k's d = 784 and its default r = 20 need a much
    # smaller adept.lr-sigma); a small instance, as the benchmarks run it
    "adept-pca": {
        "dataset": "pca-synthetic", "partitioner": "natural", "val-fraction": 0.0,
        "synthetic.dimension": 12, "synthetic.rank": 3, "synthetic.train-size": 10,
        "synthetic.test-size": 20, "adept-pca.rank": 3, "lr": 2e-3,
    },
}  # fmt: skip
"""Settings beside mnist-5k (the default dataset) that an algorithm needs to run."""


def cuda_gpus() -> int:
    import torch  # lazy: only once the arguments are read

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pollen_argv(
    mode: str, algorithm: str, device: str, gpus: int, amp: bool, rounds: int, out: Path
) -> list[str]:
    """The `pollen simulate|deploy` command of one measurement."""
    argv = [
        sys.executable, "-m", "pollen.tools.cli", mode, "--algorithm", algorithm, "--clients", "2",
        "--rounds", str(rounds), "--out", str(out), "--set", f"device={device}",
        "--set", "final-eval=false",
    ]  # fmt: skip
    for key, value in SETTINGS.get(algorithm, {}).items():
        argv += ["--set", f"{key}={value}"]
    if amp:
        argv += ["--set", "amp=true"]
    if device == "cuda" and mode == "simulate":
        argv += ["--gpus-per-client", "0.5"]  # both clients share a GPU
    if device == "cuda" and mode == "deploy":
        argv += ["--gpus", ",".join(str(i) for i in range(gpus))]
    return argv


def measure(argv: list[str], out: Path, cache: Path) -> dict[str, Any]:
    """Seconds of the run's last round (its metrics.jsonl), or the error."""
    env = dict(os.environ, POLLEN_CACHE_DIR=str(cache), FLWR_TELEMETRY_ENABLED="0")
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return {"error": lines[-1] if lines else f"exit code {done.returncode}"}
    rows = rundir.read_rounds(out)
    return {"seconds": rows[-1].seconds, "wall": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--algorithms", help="comma-separated (default: every registered one)")
    parser.add_argument("--modes", default="simulate,deploy", help="simulate, deploy or both")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per run (the last timed)")
    parser.add_argument(
        "--amp", action="store_true", help="amp=true for the algorithms that support it"
    )
    parser.add_argument("--out", help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args(argv)

    gpus = cuda_gpus()
    if gpus == 0:
        print("gpu-check: torch sees no CUDA GPU on this machine; nothing to compare (exit 0)")
        return 0
    from pollen.core.registry import ALGORITHMS  # lazy: after the GPU check

    names = args.algorithms.split(",") if args.algorithms else sorted(ALGORITHMS)
    unknown = [n for n in names if n not in ALGORITHMS]
    modes = args.modes.split(",")
    if unknown or not set(modes) <= {"simulate", "deploy"} or args.rounds < 1:
        parser.error(f"unknown algorithm(s) {unknown}" if unknown else "bad --modes or --rounds")
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="pollen-gpu-check-"))
    cache = work / "cache"
    print(f"gpu-check: {gpus} CUDA GPU(s); runs in {work}", flush=True)
    header = ("algorithm", "mode", "cuda s/round", "cpu s/round", "cpu/cuda")
    print(f"{header[0]:14s} {header[1]:9s} {header[2]:>13s} {header[3]:>12s} {header[4]:>9s}")
    failed = 0
    for mode in modes:
        for name in names:
            amp = args.amp and ALGORITHMS[name].amp
            row: dict[str, dict[str, Any]] = {}
            for device in ("cuda", "cpu"):
                out = work / f"{name}-{mode}-{device}"
                command = pollen_argv(mode, name, device, gpus, amp, args.rounds, out)
                row[device] = measure(command, out, cache)
            cells = [
                f"{row[d]['seconds']:.2f}" if "seconds" in row[d] else "failed"
                for d in ("cuda", "cpu")
            ]
            ratio = (
                f"{row['cpu']['seconds'] / row['cuda']['seconds']:.2f}"
                if "seconds" in row["cuda"] and "seconds" in row["cpu"]
                else "-"
            )
            tag = f"{name}{' (amp)' if amp else ''}"
            print(f"{tag:14s} {mode:9s} {cells[0]:>13s} {cells[1]:>12s} {ratio:>9s}", flush=True)
            for device in ("cuda", "cpu"):
                if "error" in row[device]:
                    failed += 1
                    print(f"    {device}: {row[device]['error']}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
