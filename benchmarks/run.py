"""Pollen's benchmark suite: one command, JSON per part, a table printed.

    .venv/bin/python benchmarks/run.py                       # every part
    .venv/bin/python benchmarks/run.py --parts flower,startup --rounds 3
    .venv/bin/python benchmarks/run.py --parts flower --modes deploy --save --tag=-deploy

Each part writes <part><tag>.json: by default into a scratch directory (the system's temporary
directory, pollen-bench/; --out DIR for another), into benchmarks/results/ only with --save.
The files there are those the docs cite (docs/performance.md gives each one's command; run
with --save, that command replaces the file).

Parts:
  algorithms  every registered algorithm (--modes: simulation, deployment with 2 SuperNodes):
              seconds per round split into phases
              (exchange seconds, bytes per client each way), serialization (client: arrays <->
              record bytes in the handler, Flower's object serialization of reply and
              instruction; server: arrays <-> record bytes, pushing the instructions), server
              time outside exchanges
              (aggregation, checkpoint), client time (start-up, data load, handler) and peak
              memory of server and clients (setting client-timing=true)
  flower      Pollen's FedAvg against Flower's built-in FedAvg (train + evaluate exchange per
              round; benchmarks/flower_fedavg_app.py) on the same model, data, training code and
              runtime, back to back: seconds per round, their ratio, final test accuracy of both;
              then the no-op algorithm (the runtime's messaging floor)
  scaling     simulation as clients grow (100, 1,000, 10,000): the no-op and FedAvg, Flower's
              built-in FedAvg beside them, seconds per round, peak memory of the run's whole
              process tree, growth factors; deployment: FedAvg at 2, 4, 8 SuperNodes
  fedlrt      FeDLRT against FedAvg in-process as the layer width n and rank r grow: bytes per
              client per round and seconds of one client's local step
  startup     ClientApp start-up pieces in fresh interpreters (benchmarks/messaging.py)
  resident    deployment: the no-op round with the SuperExecs' task poll at 1 s and at Pollen's
              interval; memory per node (resident worker, relay) over a long FedAvg run
  robust      one aggregation point under each robust rule (benchmarks/robust_cost.py) at 100
              and 1,000 clients: seconds and peak memory beside the folding mean
  loop        FedAvg on mnist-5k at 100 and 1,000 clients against its floor, a plain PyTorch
              loop in one thread (benchmarks/loop_floor.py), back to back: seconds per round
              with --parallel 1 and 2 (--loop-parallel) and their ratios to the loop, and where
              a simulated client's time goes (client-timing); `--loop-devices cpu,cuda` also on
              one GPU, with its utilisation
  secagg      FedAvg on mnist-5k without, with secure aggregation less the consistency round,
              and with it, deployed (5 and 16
              SuperNodes) and simulated (100 and 1,000 clients): exchanges, bytes per client
              and seconds a round
  nodes       `pollen deploy` of FedAvg on digits with 2, 4, 8, 16, 32 SuperNodes on this machine
              (--node-counts), back to back: seconds per warm round, peak memory of the process
              tree (resident and proportional) and per node, memory by role, resent
              instructions and messages the SuperLink lost

Run it niced on a quiet machine if you can; figures on a loaded one are noisy, ratios measured
back to back less so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from load import EXTRA  # noqa: E402  (this directory is on sys.path)
from messaging import measure_startup  # noqa: E402

from pollen.core import rundir  # noqa: E402  (light: no torch, no Flower)

RESULTS = ROOT / "benchmarks" / "results"
SCRATCH = Path(tempfile.gettempdir()) / "pollen-bench"
QUIET = ["--set", "server-eval=false", "--set", "client-timing=true"]


def _env(cache: Path) -> dict[str, str]:
    return dict(os.environ, POLLEN_CACHE_DIR=str(cache), FLWR_TELEMETRY_ENABLED="0")


def _median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 4) if values else float("nan")


def pollen_run(
    mode: str,
    algorithm: str,
    clients: int,
    rounds: int,
    out: Path,
    cache: Path,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    client_timing: bool = True,
    roles: bool = False,
) -> dict[str, Any]:
    """`pollen deploy|simulate` once; its metrics.jsonl, clients.jsonl and summary.json
    reduced to figures per round (round 1 left out of medians when there are more), and the
    peak of its process tree's memory. `env`: variables for this run's processes.
    `client_timing`: the setting client-timing (its serialization probe holds extra copies of
    every message: off where memory is measured)."""
    quiet = QUIET if client_timing else ["--set", "server-eval=false"]
    argv = [
        sys.executable, "-m", "pollen.tools.cli", mode, "--algorithm", algorithm,
        "--clients", str(clients), "--rounds", str(rounds), "--out", str(out), *quiet, *extra,
    ]  # fmt: skip
    started = time.monotonic()
    with subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**_env(cache), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc, TreeMemory(proc.pid, every=0.5 if roles else 0.2, roles=roles) as memory:
        stdout, stderr = proc.communicate()
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    wall = time.monotonic() - started
    if done.returncode != 0:
        error = done.stderr[-600:]
        return {
            "algorithm": algorithm, "mode": mode, "clients": clients, "error": error,
            "wall-seconds": round(wall, 2), "tree-peak-rss-mb": memory.peak_mb,
            "tree-peak-pss-mb": memory.peak_pss_mb, "roles": memory.by_role,
        }  # fmt: skip
    rows = rundir.read_rounds(out)
    steady = rows[1:] if len(rows) > 1 else rows
    phases: dict[str, dict[str, list[float]]] = {}
    for row in steady:
        for p in row.phases:
            acc = phases.setdefault(p.phase, {"seconds": [], "push": [], "down": [], "up": []})
            acc["seconds"].append(p.seconds)
            acc["push"].append(p.push_seconds)
            acc["down"].append(p.bytes_sent / max(p.sent, 1))
            acc["up"].append(p.bytes_received / max(p.valid, 1))
    client_rows = rundir.read_clients(out)
    first = rows[0].round
    timing: dict[str, list[float]] = {}
    for c in client_rows:
        for key, value in c.metrics.items():
            if not (key.startswith("time-") or key in ("peak-rss-mb", "relay-peak-rss-mb")):
                continue
            # round 1 of a long-lived (simulation) worker includes its imports: left out of
            # the per-message figures, like round 1 of the round times
            if key in ("time-handler", "time-data") and len(rows) > 1 and c.round == first:
                continue
            timing.setdefault(key, []).append(float(value))
    summary = rundir.read_summary(out)
    final = summary.final.eval if summary is not None and summary.final else {}
    seconds = [r.seconds for r in steady]
    peaks = [float(c.metrics.get("peak-rss-mb", "nan")) for c in client_rows]
    outside = [r.seconds - sum(p.seconds for p in r.phases) for r in steady]
    return {
        "algorithm": algorithm,
        "mode": mode,
        "clients": clients,
        "rounds": rounds,
        "wall-seconds": round(wall, 2),
        "round-seconds-first": rows[0].seconds,
        "round-seconds": _median(seconds),
        "server-outside-exchanges-seconds": _median(outside),
        "server-codec-seconds": _median([r.codec_seconds for r in steady]),
        "phases": {
            name: {
                "seconds": _median(acc["seconds"]),
                "push-seconds": _median(acc["push"]),
                "bytes-to-client": int(statistics.mean(acc["down"])),
                "bytes-from-client": int(statistics.mean(acc["up"])),
            }
            for name, acc in phases.items()
        },
        "client": {
            key: {"median": _median(v), "max": round(max(v), 4)} for key, v in timing.items()
        },
        "server-peak-rss-mb": summary.peak_rss_mb if summary is not None else None,
        # every process of the run at once (launcher, SuperLink, simulation or SuperNodes, Ray)
        "tree-peak-rss-mb": memory.peak_mb,
        **({"tree-peak-pss-mb": memory.peak_pss_mb, "roles": memory.by_role} if roles else {}),
        # the handling process's peak (a node's resident worker, or the ClientApp without one)
        # at the first and the last message: growth over the run
        "client-peak-rss-mb-first-last": [peaks[0], peaks[-1]] if peaks else None,
        "final-test-accuracy": final.get("test-accuracy"),
    }


ROLES = (
    ("flower-superlink", "superlink"),
    ("flower-supernode", "supernode"),
    ("client.worker", "worker"),
    ("pollen.tools.app_runner", "app-runner"),
    ("pollen.tools.cli.datacheck", "datacheck"),
    ("flower-superexec", "app-runner"),
    ("pollen-clientapp", "clientapp"),
    ("flwr-clientapp", "clientapp"),
    ("flwr-serverapp", "serverapp"),
    ("pollen.tools.cli", "launcher"),
)
"""What a process of a deployed run is, by a piece of its command line (first match)."""


def _role(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "other"
    return next((role for key, role in ROLES if key in cmd), "other")


def _pss_kb(pid: int) -> int:
    """Proportional set size: shared pages divided among the processes sharing them."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class TreeMemory:
    """The peak, over a run, of the summed resident memory of a process and all its
    descendants (Ray's workers included), sampled every `every` seconds from /proc (Linux;
    None elsewhere). Shared pages count once per process, as `ps` shows them. With `roles`,
    also the proportional set size (shared pages divided among their processes: what the
    machine holds) and, per role (ROLES), the peak of its processes' summed resident memory,
    the largest single process and how many there were at most."""

    def __init__(self, root: int, every: float = 0.2, roles: bool = False) -> None:
        self.root, self.every, self.roles = root, every, roles
        self.peak_mb: float | None = None
        self.peak_pss_mb: float | None = None
        self.by_role: dict[str, dict[str, float]] = {}
        self._names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreeMemory:
        if Path("/proc/self/statm").exists():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _sample(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            children: dict[int, list[int]] = {}
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
            total, pss, todo = 0, 0, [self.root]
            roles: dict[str, list[int]] = {}
            while todo:
                pid = todo.pop()
                todo.extend(children.get(pid, []))
                try:
                    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                except (OSError, ValueError, IndexError):
                    continue
                total += rss
                if self.roles:
                    pss += _pss_kb(pid) * 1024
                    if pid not in self._names:
                        self._names[pid] = _role(pid)
                    roles.setdefault(self._names[pid], []).append(rss)
            mb = round(total / 2**20, 1)
            if self.peak_mb is None or mb > self.peak_mb:
                self.peak_mb = mb
            if self.roles:
                pss_mb = round(pss / 2**20, 1)
                if self.peak_pss_mb is None or pss_mb > self.peak_pss_mb:
                    self.peak_pss_mb = pss_mb
                for role, sizes in roles.items():
                    seen = self.by_role.setdefault(role, {"sum-mb": 0.0, "max-mb": 0.0, "n": 0})
                    seen["sum-mb"] = max(seen["sum-mb"], round(sum(sizes) / 2**20, 1))
                    seen["max-mb"] = max(seen["max-mb"], round(max(sizes) / 2**20, 1))
                    seen["n"] = max(seen["n"], len(sizes))
            self._stop.wait(self.every)


# ---- Flower's FedAvg through the same launcher ------------------------------------------------
def flower_app_dir(work: Path) -> Path:
    """Pollen's packages plus benchmarks/flower_fedavg_app.py as a Flower app of its own (same
    bundle contents and settings; only the components differ)."""
    app = work / "flower-fedavg-app"
    if app.exists():
        return app
    app.mkdir(parents=True)
    included = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "fab-include"
    ]  # the packages the app bundles ("pkg/**/*.py"), so that this copy never falls behind
    for pkg in sorted({p.split("/")[0] for p in included if p.endswith("/**/*.py")}):
        shutil.copytree(ROOT / pkg, app / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "benchmarks" / "flower_fedavg_app.py", app / "flower_fedavg_app.py")
    shutil.copy(ROOT / "LICENSE", app / "LICENSE")
    text = (ROOT / "pyproject.toml").read_text()
    text = text.replace('serverapp = "server.app:app"', 'serverapp = "flower_fedavg_app:server"')
    text = text.replace('clientapp = "client.app:app"', 'clientapp = "flower_fedavg_app:client"')
    text = text.replace('"/LICENSE",', '"/LICENSE", "flower_fedavg_app.py",')
    (app / "pyproject.toml").write_text(text)
    return app


def flower_run(mode: str, clients: int, rounds: int, out: Path, cache: Path) -> dict[str, Any]:
    from pollen.core.runconfig import resolve
    from pollen.tools.follow import follow
    from pollen.tools.local_federation import LocalFederation

    os.environ.update(_env(cache))
    resolved = resolve({"num-clients": clients, "num-rounds": rounds, "run-name": out.name})
    resolved["out-dir"] = str(out.resolve())
    fed = LocalFederation(out / "processes", resident_workers=False)  # Flower's ClientApp: no relay
    started = time.monotonic()
    memory = TreeMemory(os.getpid()).__enter__()  # this process and the run it starts
    try:
        if mode == "deploy":
            _, fleet = fed.start_superlink()
            for i in range(clients):
                fed.start_supernode(i, clients, f"127.0.0.1:{fleet}")
            fed.wait_nodes(clients)
        else:
            fed.start_superlink(simulation=True)
            fed.configure_simulation(clients, max(1, (os.cpu_count() or 1)))
        run_id = fed.submit(resolved, app=flower_app_dir(out.parent))
        status = follow(fed, run_id, out, 3600, stream=io.StringIO())
    finally:
        fed.stop()
        memory.__exit__()
    wall = time.monotonic() - started
    if status.get("status") != "finished:completed":
        return {"algorithm": "flower-fedavg", "mode": mode, "error": str(status)}
    report = json.loads((out / "flower-fedavg.json").read_text())
    secs = report["round-seconds"]
    return {
        "algorithm": "flower-fedavg",
        "mode": mode,
        "clients": clients,
        "rounds": rounds,
        "wall-seconds": round(wall, 2),
        "round-seconds-first": secs[0],
        "round-seconds": _median(secs[1:] if len(secs) > 1 else secs),
        "final-test-accuracy": report["client-eval"][-1].get("test-accuracy"),
        "tree-peak-rss-mb": memory.peak_mb,
    }


def part_flower(args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    rows = []
    for mode in args.modes:
        for repeat in range(args.repeats):
            ours = pollen_run(
                mode, "fedavg", 2, args.rounds, work / f"{mode}-pollen-{repeat}", cache,
                ["--set", "final-eval=true"],
            )  # fmt: skip
            theirs = flower_run(mode, 2, args.rounds, work / f"{mode}-flower-{repeat}", cache)
            ratio = (
                round(ours["round-seconds"] / theirs["round-seconds"], 3)
                if "error" not in ours and "error" not in theirs
                else None
            )
            floor = pollen_run(mode, "noop", 2, args.rounds, work / f"{mode}-noop-{repeat}", cache)
            row = {"mode": mode, "pollen": ours, "flower": theirs, "noop": floor, "ratio": ratio}
            if mode == "deploy":  # the same run without resident workers, and the targets
                row["pollen-no-worker"] = pollen_run(
                    mode, "fedavg", 2, args.rounds, work / f"{mode}-noworker-{repeat}", cache,
                    ["--set", "final-eval=true", "--no-worker"],
                )  # fmt: skip
                # the floor with the model's bytes each way (the no-op echoes what it gets)
                kb = ours.get("phases", {}).get("train", {}).get("bytes-to-client", 0) // 1024
                row["noop-payload"] = pollen_run(
                    mode, "noop", 2, args.rounds, work / f"{mode}-noop-payload-{repeat}", cache,
                    ["--set", f"noop.payload-kb={kb}"],
                )  # fmt: skip
                row["targets"] = _deploy_targets(ours, theirs, floor)
                row["targets-payload-floor"] = _deploy_targets(ours, theirs, row["noop-payload"])
                _say(f"flower    {mode:9s} targets {row['targets']}")
                _say(f"flower    {mode:9s} targets, no-op with the model's bytes as floor "
                     f"{row['targets-payload-floor']}")  # fmt: skip
            rows.append(row)
            _say(
                f"flower    {mode:9s} pollen {ours.get('round-seconds', 'err')} s/round "
                f"(acc {ours.get('final-test-accuracy')}), flower "
                f"{theirs.get('round-seconds', 'err')} s/round "
                f"(acc {theirs.get('final-test-accuracy')}), ratio {ratio}; no-op floor "
                f"{floor.get('round-seconds', 'err')} s/round"
            )
    return {"rows": rows}


def _deploy_targets(
    ours: dict[str, Any], theirs: dict[str, Any], floor: dict[str, Any]
) -> dict[str, Any]:
    """Pollen's deployed FedAvg round against Flower's (ratio, target <= 0.45) and against the
    no-op round plus 1.3 x the clients' pure training time (the handler: evaluation of the
    received model, training, weights out)."""
    if any("error" in r for r in (ours, theirs, floor)):
        return {}
    handler = ours["client"].get("time-handler", {}).get("median", float("nan"))
    bound = floor["round-seconds"] + 1.3 * handler
    ratio = ours["round-seconds"] / theirs["round-seconds"]
    return {
        "ratio-to-flower": round(ratio, 3),
        "ratio-met": ratio <= 0.45,
        "client-handler-seconds": handler,
        "noop-plus-1.3-handler": round(bound, 3),
        "floor-bound-met": ours["round-seconds"] <= bound,
    }


def part_resident(args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    """The resident worker's other figures, in deployment with 2 SuperNodes: the no-op round
    with the SuperExecs' task poll at Flower's 1 s and at Pollen's interval, alternating; and
    a long FedAvg run's memory per node (worker and relay) from its first to its last round."""
    from pollen.tools.processes import TASK_POLL_INTERVAL

    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for interval in ("1.0", TASK_POLL_INTERVAL):
            row = pollen_run(
                "deploy", "noop", 2, args.rounds, work / f"poll-{interval}-{repeat}", cache,
                env={"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": interval},
            )  # fmt: skip
            row["task-poll-interval"] = float(interval)
            rows.append(row)
            _say(f"resident  no-op, task poll {interval} s: {row.get('round-seconds')} s/round")
    if args.memory_rounds < 1:
        return {"poll": rows}
    long = pollen_run(
        "deploy", "fedavg", 2, args.memory_rounds, work / "memory", cache,
        ["--set", "final-eval=false"],
    )  # fmt: skip
    _say(
        f"resident  fedavg {args.memory_rounds} rounds: {long.get('round-seconds')} s/round; "
        f"worker peak RSS first/last {long.get('client-peak-rss-mb-first-last')} MB, relay "
        f"{long.get('client', {}).get('relay-peak-rss-mb')} MB"
    )
    return {"poll": rows, "memory": long}


def part_nodes(args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    """`pollen deploy` with 2, 4, 8, 16 ... SuperNodes on this machine (--node-counts; a count
    given twice runs twice), FedAvg on digits, one after the other: seconds per warm round
    (median of the rounds after the first), wall time, the peak of the whole process tree's
    memory (resident, and proportional: shared pages divided among the processes) and that
    peak per node, memory by role, resent instructions, and what Flower's processes logged
    about lost messages. --node-extra adds options (e.g. `--worker-per-node`)."""
    rows = []
    for i, n in enumerate(args.node_counts):
        out = work / f"nodes-{n}-{i}"
        row = pollen_run(
            "deploy", "fedavg", n, args.rounds, out, cache,
            ["--dataset", "digits", "--set", "final-eval=false", *args.node_extra],
            client_timing=False, roles=True,
        )  # fmt: skip
        row["ok"] = "error" not in row
        for key in ("tree-peak-rss-mb", "tree-peak-pss-mb"):
            if row.get(key):
                row[key.replace("tree-peak", "per-node")] = round(row[key] / n, 1)
        row.update(_lost_and_resent(out))
        rows.append(row)
        roles = ", ".join(
            f"{r} {v['sum-mb']:.0f} MB ({v['n']:g} x <= {v['max-mb']:.0f})"
            for r, v in sorted(row.get("roles", {}).items())
        )
        _say(
            f"nodes     {n:3d} SuperNodes: {'ok' if row['ok'] else 'FAILED'}, "
            f"{row.get('round-seconds', '-')} s/warm round, wall {row.get('wall-seconds')} s, "
            f"peak RSS {row.get('tree-peak-rss-mb')} MB ({row.get('per-node-rss-mb')} per "
            f"node), PSS {row.get('tree-peak-pss-mb')} MB ({row.get('per-node-pss-mb')} per "
            f"node); resent {row['resent']}, 'database is locked' {row['database-locked']}"
            + (f"; error: {row['error'][-300:]}" if "error" in row else "")
        )
        _say(f"nodes     {n:3d} by role: {roles}")
    return {"rows": rows}


def _lost_and_resent(out: Path) -> dict[str, Any]:
    """From a deployed run's directory: instructions sent again, the SuperLink's
    'database is locked' errors and the SuperNodes' failed sends."""

    def count(paths: Sequence[Path], text: str) -> int:
        total = 0
        for path in paths:
            with contextlib.suppress(OSError):
                total += path.read_text(errors="replace").count(text)
        return total

    resent = 0
    with contextlib.suppress(OSError, rundir.ResultsFileError):
        for event in rundir.read_events(out):
            if event.kind == rundir.Event.RESEND:
                resent += len(event.fields.get("nodes", []))
    procs = out / rundir.PROCESSES
    return {
        "resent": resent,
        "database-locked": count([procs / "superlink.log"], "database is locked"),
        "failed-sends": count(sorted(procs.glob("supernode-*.log")), "Failed to send message"),
    }


# ---- the other parts --------------------------------------------------------------------------
ALGORITHM_SETS: dict[str, list[str]] = {
    # where an algorithm's defaults do not fit mnist-5k's MLP: ADEPT-PCA runs at the load
    # benchmark's small size (its defaults, d = 150 and r = 20, need adept.lr-sigma below
    # sigma_0^2 / (d r))
    "adept-pca": [f"--set={key}={value}" for key, value in EXTRA["adept-pca"].items()],
}


def part_algorithms(args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    from pollen.core.registry import ALGORITHMS

    rows = []
    runs = [(m, n) for m in args.modes for n in args.algorithms or list(ALGORITHMS)]
    for mode, name in runs:
        row = pollen_run(
            mode, name, 2, args.rounds, work / f"alg-{mode}-{name}", cache,
            ["--set", "final-eval=false", *ALGORITHM_SETS.get(name, [])],
        )  # fmt: skip
        rows.append(row)
        if "error" in row:
            _say(f"algorithm {name:11s} {mode} failed: {row['error'][-200:]}")
            continue
        split = ", ".join(
            f"{p} {v['seconds']:.2f} s "
            f"{v['bytes-to-client'] // 1024}/{v['bytes-from-client'] // 1024} KiB"
            for p, v in row["phases"].items()
        )
        handler = row["client"].get("time-handler", {}).get("median", float("nan"))
        serial = {
            k: row["client"].get(f"time-{k}", {}).get("median", float("nan"))
            for k in ("codec", "serialize", "deserialize")
        }
        push = sum(v["push-seconds"] for v in row["phases"].values())
        _say(
            f"algorithm {name:11s} {mode:8s} serialization: client codec {serial['codec']:.4f} s, "
            f"Flower serialize {serial['serialize']:.4f} s, deserialize "
            f"{serial['deserialize']:.4f} s; server codec {row['server-codec-seconds']:.4f} s, "
            f"push {push:.4f} s"
        )
        _say(
            f"algorithm {name:11s} {mode:8s} {row['round-seconds']:.2f} s/round; {split}; "
            f"server outside "
            f"exchanges {row['server-outside-exchanges-seconds']:.2f} s; client handler "
            f"{handler:.2f} s; peak RSS server {row['server-peak-rss-mb']} MB client "
            f"{row['client'].get('peak-rss-mb', {}).get('max')} MB"
        )
    return {"rows": rows}


# a dataset that holds 10,000 clients: FedEM's synthetic data, a few examples each
SYNTHETIC = ["--dataset", "fedem-synthetic", "--set", "partitioner=natural",
             "--set", "synthetic.train-size=10", "--set", "synthetic.test-size=10"]  # fmt: skip


def part_scaling(args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    """Simulation as clients grow (docs/performance.md#simulation-at-scale): the no-op and
    FedAvg on mnist-5k at --scale-clients up to 5,000 with Flower's built-in FedAvg beside them
    at the same counts, and on FedEM's synthetic data (which holds 10,000 clients) at the
    larger counts; seconds per exchange or round, wall time, peak memory of the whole process
    tree, and the growth factors. Deployment: FedAvg seconds per round at --deploy-clients."""
    rows: list[dict[str, Any]] = []
    counts = args.scale_clients
    if "simulate" in args.modes:
        series: list[tuple[str, list[int], list[str]]] = [
            ("mnist-5k", [n for n in counts if n <= 5000], [])
        ]
        series.append(("fedem-synthetic", [n for n in counts if n >= 1000], SYNTHETIC))
        for dataset, ns, data in series:
            for algorithm in ("noop", "fedavg"):
                for n in ns:
                    row = pollen_run(
                        "simulate", algorithm, n, args.scaling_rounds,
                        work / f"scale-{dataset}-{algorithm}-{n}", cache,
                        ["--set", "final-eval=false", *data], client_timing=False,
                    )  # fmt: skip
                    row["dataset"] = dataset
                    rows.append(row)
                    _say_scale(row)
            if dataset == "fedem-synthetic" and ns:  # a tenth sampled at the largest count
                row = pollen_run(
                    "simulate", "fedavg", ns[-1], args.scaling_rounds,
                    work / f"scale-{dataset}-sampled-{ns[-1]}", cache,
                    ["--set", "final-eval=false", "--set", "fraction-train=0.1", *data],
                    client_timing=False,
                )  # fmt: skip
                row.update(dataset=dataset, algorithm="fedavg-sampled-0.1")
                rows.append(row)
                _say_scale(row)
            if dataset == "mnist-5k" and args.scale_flower:
                for n in [n for n in ns if n <= 1000]:
                    row = flower_run("simulate", n, args.scaling_rounds, work / f"fl-{n}", cache)
                    row["dataset"] = dataset
                    rows.append(row)
                    _say_scale(row)
    if "deploy" in args.modes:
        for n in args.deploy_clients:
            row = pollen_run(
                "deploy", "fedavg", n, args.scaling_rounds, work / f"scale-deploy-{n}", cache,
                ["--set", "final-eval=false"],
            )  # fmt: skip
            rows.append(row)
            _say_scale(row)
    growth = _growth(rows)
    for line in growth:
        _say(f"scaling   {line['what']}: {line['figure']}")
    return {"rows": rows, "growth": growth}


def _say_scale(row: dict[str, Any]) -> None:
    _say(
        f"scaling   {row['mode']:8s} {row.get('dataset', ''):15s} {row['algorithm']:13s} "
        f"{row.get('clients', '?'):>6} clients: {row.get('round-seconds', 'err')} s/round, "
        f"wall {row.get('wall-seconds')} s, tree peak {row.get('tree-peak-rss-mb')} MB"
        + (f" ({row['error'][-200:]})" if "error" in row else "")
    )


def _growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Growth factors between consecutive client counts of each series, Pollen's FedAvg
    against Flower's at the same count, and the issue's figures beside them."""
    out: list[dict[str, Any]] = []
    ok = [r for r in rows if "error" not in r and r["mode"] == "simulate"]
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in ok:
        series.setdefault((r["dataset"], r["algorithm"]), []).append(r)
    for (dataset, algorithm), rs in series.items():
        rs.sort(key=lambda r: r["clients"])
        for a, b in itertools.pairwise(rs):
            what = f"{algorithm} on {dataset}, {a['clients']} -> {b['clients']} clients"
            figure = {
                "clients": round(b["clients"] / a["clients"], 2),
                "round-seconds": round(b["round-seconds"] / a["round-seconds"], 2),
            }
            if a.get("tree-peak-rss-mb") and b.get("tree-peak-rss-mb"):
                figure["tree-peak-rss"] = round(b["tree-peak-rss-mb"] / a["tree-peak-rss-mb"], 2)
            out.append({"what": what, "figure": figure})
    full = {r["clients"]: r for r in series.get(("fedem-synthetic", "fedavg"), [])}
    for r in series.get(("fedem-synthetic", "fedavg-sampled-0.1"), []):
        if r["clients"] in full:
            ratio = round(r["round-seconds"] / full[r["clients"]]["round-seconds"], 3)
            out.append({
                "what": f"FedAvg with fraction-train 0.1 / all clients at {r['clients']} (s/round)",
                "figure": ratio,
            })  # fmt: skip
    pollen = {r["clients"]: r for r in series.get(("mnist-5k", "fedavg"), [])}
    for r in series.get(("mnist-5k", "flower-fedavg"), []):
        if r["clients"] in pollen:
            ratio = round(pollen[r["clients"]]["round-seconds"] / r["round-seconds"], 3)
            out.append({
                "what": f"Pollen FedAvg / Flower's FedAvg at {r['clients']} clients (s/round)",
                "figure": ratio,
            })  # fmt: skip
    return out


def part_fedlrt(args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    from fedlrt_scaling import measure

    rows = measure(args.fedlrt_sizes)
    for r in rows:
        _say(
            f"fedlrt    n={r['n']:5d} r={r['rank']:3d}: "
            f"bytes/client/round {r['fedlrt-bytes']:>10d} "
            f"vs FedAvg {r['fedavg-bytes']:>10d} ({r['bytes-ratio']:.3f}); local step "
            f"{r['fedlrt-seconds']:.4f} s vs {r['fedavg-seconds']:.4f} s"
        )
    return {"rows": rows}


def part_robust(args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    from robust_cost import measure

    rows = measure(args.robust_clients, args.robust_params)
    for r in rows:
        _say(
            f"robust    n={r['clients']:5d} d={r['params']} f={r['f']:3d} {r['rule']:20s} "
            f"{r['seconds']:9.3f} s  peak {r['peak-mb']:9.1f} MB ({r['models-held']:.1f} "
            "float64 models)"
        )
    return {"rows": rows}


def part_startup(args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    # a partition in the cache first, as in a run
    pollen_run("simulate", "noop", 2, 1, work / "startup-warm", cache)
    result = measure_startup(cache, args.repeats_startup)
    for label, secs in result.items():
        _say(f"start-up  {label:58s} {secs['wall']:7.3f} s wall {secs['cpu']:6.3f} s CPU")
    return result


CLIENT_STAGES = (
    ("time-data", "data load"),
    ("time-handler", "handler (model, training, evaluation; data load and codec included)"),
    ("time-codec", "arrays <-> record bytes"),
    ("time-deserialize", "Flower: instruction rebuilt from its objects"),
    ("time-serialize", "Flower: reply turned into objects"),
)
"""The per-client stages of a profiled round (setting client-timing), in the order shown."""


def part_loop(args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    """FedAvg on mnist-5k against its floor, back to back at each of --loop-clients: the plain
    loop of benchmarks/loop_floor.py (one thread) and `pollen simulate` with each --parallel of
    --loop-parallel, seconds per round and their ratios; then (--loop-profile) one more Pollen
    run with client-timing for where a simulated client's time goes (per-client medians, the
    server's per-round parts). With cuda in --loop-devices, the same on the GPU: the loop there,
    and `pollen simulate --set device=cuda --gpus-per-client 1/P --parallel P` (P clients share
    the GPU), each beside the GPU's utilisation in its warm rounds (GpuUse)."""
    from loop_floor import measure  # lazy: torch

    rows: list[dict[str, Any]] = []
    extra = ["--set", "final-eval=false"]
    for n in args.loop_clients:
        row: dict[str, Any] = {"clients": n}
        for device in args.loop_devices:
            on_gpu = device == "cuda"
            prefix = "cuda-" if on_gpu else ""
            loop = measure(n, args.loop_rounds, cache, device=device)
            _say(f"loop      {n:>6} clients: plain loop on {device} "
                 f"{loop['round-seconds']} s/round (1 thread)")  # fmt: skip
            row[f"{prefix}loop"] = loop
            for parallel in args.loop_parallel:
                gpu = ["--set", "device=cuda", "--gpus-per-client", repr(1 / parallel)]
                name = f"loop-{n}-{device}-p{parallel}"
                with GpuUse(work / name, args.loop_rounds, active=on_gpu) as use:
                    run = pollen_run(
                        "simulate", "fedavg", n, args.loop_rounds, work / name, cache,
                        [*extra, "--parallel", str(parallel), *(gpu if on_gpu else [])],
                        client_timing=False,
                    )  # fmt: skip
                ratio = (
                    round(run["round-seconds"] / loop["round-seconds"], 2) if "error" not in run
                    else None
                )  # fmt: skip
                if on_gpu:
                    run["gpu-use"] = use.summary()
                row[f"{prefix}pollen-parallel-{parallel}"] = run
                row[f"{prefix}ratio-parallel-{parallel}"] = ratio
                used = f", GPU {run['gpu-use']}" if on_gpu else ""
                _say(f"loop      {n:>6} clients: pollen on {device} --parallel {parallel} "
                     f"{run.get('round-seconds', run.get('error'))} s/round, {ratio}x the "
                     f"loop{used}")  # fmt: skip
        if args.loop_profile:
            profiled = pollen_run(
                "simulate", "fedavg", n, args.loop_rounds, work / f"loop-{n}-profile", cache,
                [*extra, "--parallel", "1"],
            )  # fmt: skip
            row["profile"] = _profile(profiled, n)
        rows.append(row)
    return {"rows": rows}


class GpuUse:
    """The GPU's utilisation while a run trains, read from `nvidia-smi` every 0.2 s: each
    sample is tagged with the rounds the run's metrics.jsonl holds at that moment, and the
    summary keeps the warm rounds (2..rounds, after round 1's line and before the last one's),
    like the seconds per round: mean and peak utilisation (nvidia-smi's share of the sample
    period in which a kernel ran), the share of samples with any kernel running, and the GPU
    memory in use at most over the whole run. Inactive (`active` False) it reads nothing."""

    def __init__(self, out: Path, rounds: int, active: bool = True) -> None:
        self.metrics, self.rounds, self.active = out / rundir.METRICS, rounds, active
        self.samples: list[tuple[int, float, float]] = []
        self.error: str | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> GpuUse:
        if not self.active:
            return self
        query = "--query-gpu=utilization.gpu,memory.used"
        try:
            self._proc = subprocess.Popen(
                ["nvidia-smi", query, "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
        except OSError as exc:
            self.error = f"nvidia-smi: {exc}"
            return self
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
            self._thread.join()

    def _done(self) -> int:
        try:
            return self.metrics.read_bytes().count(b"\n")
        except OSError:
            return 0

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                util, memory = (float(x) for x in line.split(",")[:2])
            except ValueError:
                continue
            self.samples.append((self._done(), util, memory))

    def summary(self) -> dict[str, Any]:
        if self.error is not None or not self.samples:
            return {"error": self.error or "no samples from nvidia-smi"}
        first = 1 if self.rounds > 1 else 0
        warm = [util for done, util, _ in self.samples if first <= done < self.rounds]
        return {
            "warm-samples": len(warm),
            "mean-utilisation-percent": round(statistics.mean(warm), 1) if warm else None,
            "max-utilisation-percent": max(warm) if warm else None,
            "busy-share": round(sum(u > 0 for u in warm) / len(warm), 3) if warm else None,
            "peak-memory-mib": max(memory for _, _, memory in self.samples),
        }


def _profile(run: dict[str, Any], clients: int) -> dict[str, Any]:
    """A profiled run's stages: per client (medians, ms) and per round (s)."""
    if "error" in run:
        _say(f"loop      profile failed: {run['error'][-200:]}")
        return {"error": run["error"]}
    client = run.get("client", {})
    per_client = {
        label: round(1000 * client[key]["median"], 3) for key, label in CLIENT_STAGES
        if key in client
    }  # fmt: skip
    train = run["phases"].get("train", {})
    per_round = {
        "round": run["round-seconds"],
        "train exchange": train.get("seconds"),
        "push of the instructions": train.get("push-seconds"),
        "server codec": run["server-codec-seconds"],
        "server outside exchanges (aggregation, checkpoint, files)": run[
            "server-outside-exchanges-seconds"
        ],
    }
    for label, ms in per_client.items():
        _say(f"loop      {clients:>6} clients, per client: {label}: {ms} ms")
    for label, secs in per_round.items():
        _say(f"loop      {clients:>6} clients, per round: {label}: {secs} s")
    return {"per-client-ms": per_client, "per-round-seconds": per_round}


def _secure_figures(run: dict[str, Any]) -> dict[str, Any]:
    """A run's cost a round: exchanges, bytes per client (to it and from it, every phase),
    seconds (the round, and each of secure aggregation's stages)."""
    if "error" in run:
        return {"error": run["error"]}
    phases = run["phases"]
    both = {name: p["bytes-to-client"] + p["bytes-from-client"] for name, p in phases.items()}
    return {
        "exchanges": len(phases),
        "bytes-per-client": sum(both.values()),
        "bytes-per-client-secagg-stages": sum(
            b for name, b in both.items() if name.startswith("query.secagg")
        ),
        "round-seconds": run["round-seconds"],
        "round-seconds-first": run["round-seconds-first"],
        "phase-seconds": {name: p["seconds"] for name, p in phases.items()},
        "final-test-accuracy": run.get("final-test-accuracy"),
        "tree-peak-rss-mb": run.get("tree-peak-rss-mb"),
    }


def part_secagg(args: argparse.Namespace, work: Path, cache: Path) -> dict[str, Any]:
    """Secure aggregation's cost a round, FedAvg on mnist-5k: deployed (`--secagg-deploy`
    SuperNodes) and simulated (`--secagg-simulate` clients), each run without it, with it but
    without the consistency round (`unsigned`) and with it (the default), in turn; exchanges,
    bytes per client and seconds a round (docs/security.md)."""
    rows = []
    cases = [("deploy", n) for n in args.secagg_deploy]
    cases += [("simulate", n) for n in args.secagg_simulate]
    for mode, clients in cases:
        row: dict[str, Any] = {"mode": mode, "clients": clients}
        for tag, extra in (
            ("plain", []),
            ("unsigned", ["--set", "secagg.enabled=true", "--set", "secagg.consistency=false"]),
            ("secagg", ["--set", "secagg.enabled=true"]),
        ):
            run = pollen_run(mode, "fedavg", clients, args.rounds,
                             work / f"secagg-{mode}-{clients}-{tag}", cache,
                             ["--set", "final-eval=true", *extra])  # fmt: skip
            row[tag] = _secure_figures(run)
            shown = row[tag]
            _say(f"secagg    {mode:9s} {clients:>5} clients {tag:7s}: "
                 f"{shown.get('round-seconds', shown.get('error'))} s/round, "
                 f"{shown.get('bytes-per-client')} bytes/client, "
                 f"{shown.get('exchanges')} exchanges")  # fmt: skip
        rows.append(row)
    return {"rows": rows}


PARTS: dict[str, Callable[[argparse.Namespace, Path, Path], dict[str, Any]]] = {
    "startup": part_startup,
    "algorithms": part_algorithms,
    "flower": part_flower,
    "fedlrt": part_fedlrt,
    "scaling": part_scaling,
    "resident": part_resident,
    "robust": part_robust,
    "nodes": part_nodes,
    "loop": part_loop,
    "secagg": part_secagg,
}


def _say(text: str) -> None:
    print(text, flush=True)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--modes", default="simulate,deploy", type=lambda s: s.split(","))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1, help="flower comparison repeats")
    parser.add_argument("--repeats-startup", type=int, default=3)
    parser.add_argument("--algorithms", type=lambda s: s.split(","), default=None)
    parser.add_argument("--deploy-clients", type=_ints, default=_ints("2,4,8"))
    parser.add_argument("--scaling-rounds", type=int, default=3)
    parser.add_argument(
        "--node-counts", type=_ints, default=_ints("2,4,8,16,32"),
        help="nodes: SuperNodes of each deployment, in order (a count twice: two tries)",
    )  # fmt: skip
    parser.add_argument(
        "--node-extra", type=lambda s: s.split(), default=[],
        help="nodes: more options of each `pollen deploy`, e.g. '--worker-per-node'",
    )  # fmt: skip
    parser.add_argument(
        "--scale-clients", type=_ints, default=_ints("100,1000,10000"),
        help="scaling: simulated client counts (mnist-5k up to 5,000; FedEM's synthetic data "
        "from 1,000)",
    )  # fmt: skip
    parser.add_argument(
        "--scale-flower", type=int, default=1,
        help="scaling: 1 runs Flower's built-in FedAvg beside Pollen's at up to 1,000 clients",
    )  # fmt: skip
    parser.add_argument(
        "--memory-rounds", type=int, default=50, help="resident: the long run's rounds (0: none)"
    )
    parser.add_argument(
        "--fedlrt-sizes", type=lambda s: [tuple(_ints(x)) for x in s.split(";")],
        default="256,16;1024,32;4096,64", help="n,r pairs separated by ;",
    )  # fmt: skip
    parser.add_argument(
        "--robust-clients", type=_ints, default=_ints("100,1000"),
        help="robust: clients at one aggregation point",
    )  # fmt: skip
    parser.add_argument(
        "--robust-params", type=int, default=199210,
        help="robust: model parameters (default: the MLP of mnist-5k)",
    )  # fmt: skip
    parser.add_argument(
        "--loop-clients", type=_ints, default=_ints("100,1000"),
        help="loop: client counts of FedAvg on mnist-5k against the plain loop",
    )  # fmt: skip
    parser.add_argument("--loop-rounds", type=int, default=3, help="loop: rounds of each run")
    parser.add_argument(
        "--loop-parallel", type=_ints, default=_ints("1,2"),
        help="loop: the --parallel of each Pollen run (on cuda: 1/P GPU per client)",
    )  # fmt: skip
    parser.add_argument(
        "--loop-devices", type=lambda s: s.split(","), default=["cpu"],
        help="loop: cpu, cuda or both: where the loop and the clients train",
    )  # fmt: skip
    parser.add_argument(
        "--loop-profile", type=int, default=1, help="loop: 0 leaves the profiled run out"
    )
    parser.add_argument(
        "--secagg-deploy", type=_ints, default=_ints("5,16"),
        help="secagg: deployed SuperNodes of each pair of runs",
    )  # fmt: skip
    parser.add_argument(
        "--secagg-simulate", type=_ints, default=_ints("100,1000"),
        help="secagg: simulated clients of each pair of runs",
    )  # fmt: skip
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--out", default=str(SCRATCH), help="directory of the JSON files (default: %(default)s)"
    )
    where.add_argument(
        "--save", action="store_true",
        help=f"write the JSON files into {RESULTS.relative_to(ROOT)}/, the figures the docs cite",
    )  # fmt: skip
    parser.add_argument("--tag", default="", help="suffix of the JSON file names")
    args = parser.parse_args()
    if isinstance(args.fedlrt_sizes, str):
        args.fedlrt_sizes = [tuple(_ints(x)) for x in args.fedlrt_sizes.split(";")]
    work = Path(tempfile.mkdtemp(prefix="pollen-bench-"))
    cache = work / "cache"
    out = RESULTS if args.save else Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    for part in args.parts.split(","):
        load = os.getloadavg()[0]
        result = PARTS[part](args, work, cache)
        doc = {
            "part": part,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": machine,
            "load-average-1min-before": round(load, 2),
            "result": result,
        }
        path = out / f"{part}{args.tag}.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        _say(f"-> {path}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
