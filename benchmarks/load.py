"""Load benchmark: a 100-client simulation and an 8-SuperNode deployment per algorithm, with the
memory of every Flower process measured while it runs.

Runs `pollen simulate --clients 100` and `pollen deploy --clients 8` for each algorithm (a few
rounds on digits), samples /proc every 0.5 s for the processes of the run (those whose command
line or environment points into its output directory) and records each process's peak resident
memory (VmHWM, else the largest VmRSS seen), grouped by role: SuperLink, ServerApp, SuperNode,
ClientApp (one process per message in deployment), simulation worker. Writes JSON (default
pollen-bench/load.json in the system's temporary directory) and prints a table.

    nice -n 10 .venv/bin/python benchmarks/load.py [--algorithms fedavg,fedem] [--rounds 2]
        [--sim-clients 100] [--sim-sampled 10] [--nodes 8] [--modes simulate,deploy] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pollen.core import rundir  # noqa: E402  (the checkout's, as the runs use)

FEDSC = {"fedsc.dim": 16, "fedsc.passes": 1, "fedsc.views-per-pass": 1, "fedsc.knn-k": 5,
         "fedsc.probe-epochs": 1}  # fmt: skip
# settings an algorithm needs to run small (and the dataset it runs on)
EXTRA: dict[str, dict[str, Any]] = {
    "fedem": {"fedem.components": 2},
    "d-fedem": {"fedem.components": 2},
    "fedlrt": {"fedlrt.max-rank": 8},
    "fedsc": FEDSC,
    "fedavg-sc": FEDSC,
    "fedavg-simclr": FEDSC,
    "fedavg-byol": FEDSC,
    "adept-pca": {"dataset": "pca-synthetic", "partitioner": "natural", "val-fraction": 0.0,
                  "synthetic.dimension": 12, "synthetic.rank": 3, "synthetic.train-size": 10,
                  "synthetic.test-size": 20, "adept-pca.rank": 3, "lr": 2e-3},
    "adept-ae": {"adept-ae.latent": 4, "adept-ae.local-steps": 2},
}  # fmt: skip
ROLES = (  # first match wins; a Ray worker's arguments name the raylet, so workers come first
    ("flower-superlink", "superlink"),
    ("flwr-serverapp", "serverapp"),
    ("flwr-simulation", "serverapp"),
    ("flower-supernode", "supernode"),
    ("flwr-clientapp", "clientapp"),
    ("flower-superexec", "superexec"),
    ("ray::ClientAppActor", "simulation-worker"),
    ("default_worker.py", "simulation-worker"),
    ("ray::", "ray"),
    ("raylet", "ray"),
    ("gcs_server", "ray"),
    ("site-packages/ray/", "ray"),  # Ray's Python daemons (monitor, dashboard, log monitor)
    ("pollen.tools.cli", "launcher"),
    ("bin/flwr ", "flwr-cli"),
)


def _role(cmd: str) -> str:
    for needle, role in ROLES:
        if needle in cmd:
            return role
    return "other"


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def sample(needle: bytes, peaks: dict[int, dict[str, Any]]) -> None:
    """Update each matching live process's peak resident memory (MB)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = _read(f"/proc/{pid}/cmdline")
            if needle not in cmd and needle not in _read(f"/proc/{pid}/environ"):
                continue
            status = _read(f"/proc/{pid}/status").decode()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        kb = max(int(fields.get(k, "0 kB").split()[0]) for k in ("VmHWM", "VmRSS"))
        if kb == 0:
            continue
        text = cmd.replace(b"\0", b" ").decode(errors="replace")
        entry = peaks.setdefault(int(pid), {"role": "other", "mb": 0.0, "cmd": text[:120]})
        role = _role(text)  # a process may re-title itself (Ray workers do): keep the specific
        if role != "other":
            entry["role"], entry["cmd"] = role, text[:120]
        entry["mb"] = max(entry["mb"], kb / 1024)


def run(
    mode: str, algorithm: str, clients: int, rounds: int, work: Path, sampled: int = 0
) -> dict[str, Any]:
    """One run; `sampled` > 0 samples that many of the clients per round (all answer the
    greeting, so all are connected and known to the server)."""
    out = work / f"{mode}-{algorithm}-{clients}"
    argv = [sys.executable, "-m", "pollen.tools.cli", mode, "--algorithm", algorithm,
            "--clients", str(clients), "--rounds", str(rounds), "--out", str(out),
            "--set", "final-eval=false", "--set", "poll-interval=0.5"]  # fmt: skip
    if sampled:
        argv += ["--set", f"fraction-train={sampled / clients}",
                 "--set", f"min-train-clients={sampled}"]  # fmt: skip
    extra = {"dataset": "digits", **EXTRA.get(algorithm, {})}
    argv += ["--dataset", str(extra.pop("dataset"))]
    for key, value in extra.items():
        argv += ["--set", f"{key}={value}"]
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0")
    peaks: dict[int, dict[str, Any]] = {}
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    log = open(work / f"{out.name}.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    while proc.poll() is None:
        sample(str(out).encode(), peaks)
        time.sleep(0.5)
    log.close()
    seconds = time.monotonic() - started
    by_role: dict[str, list[float]] = {}
    commands: dict[str, str] = {}
    for entry in peaks.values():
        by_role.setdefault(entry["role"], []).append(entry["mb"])
        commands.setdefault(entry["role"], entry["cmd"])
    summary = rundir.read_summary(out)
    return {
        "mode": mode,
        "algorithm": algorithm,
        "clients": clients,
        "sampled-per-round": sampled or clients,
        "rounds": rounds,
        "returncode": proc.returncode,
        "status": summary.status if summary is not None else "missing",
        "seconds": round(seconds, 1),
        "load-average-1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "memory-mb": {
            role: {
                "processes": len(v),
                "peak-max": round(max(v), 1),
                "peak-mean": round(sum(v) / len(v), 1),
            }
            for role, v in sorted(by_role.items())
        },
        "command-per-role": commands,
    }


def main() -> None:
    from pollen.core.registry import ALGORITHMS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = ",".join(a for a in ALGORITHMS if a != "noop")
    parser.add_argument("--algorithms", default=default)
    parser.add_argument("--modes", default="simulate,deploy")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sim-clients", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument(
        "--sim-sampled",
        type=int,
        default=0,
        help="clients sampled per round in simulation (0: all)",
    )
    scratch = Path(tempfile.gettempdir()) / "pollen-bench" / "load.json"
    parser.add_argument("--out", default=str(scratch))
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    out_file = Path(args.out)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pollen-load-") as tmp:
        for algorithm in args.algorithms.split(","):
            for mode in args.modes.split(","):
                clients = args.sim_clients if mode == "simulate" else args.nodes
                sampled = args.sim_sampled if mode == "simulate" else 0
                result = run(mode, algorithm, clients, args.rounds, Path(tmp), sampled)
                results.append(result)
                mem = result["memory-mb"]
                cells = "  ".join(
                    f"{role} {m['processes']}x peak {m['peak-max']:.0f} MB"
                    for role, m in mem.items()
                )
                print(f"{mode:8} {algorithm:10} {clients:3} clients  {result['status']:9} "
                      f"{result['seconds']:6.0f} s  {cells}", flush=True)  # fmt: skip
                machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
                out_file.write_text(json.dumps({"machine": machine, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
