"""`pollen`: run federations locally (deploy, simulate), join real ones (server, client, run),
and read results (report)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from client import resident
from pollen.core import registry, runconfig, rundir
from pollen.core import settings as settings_mod
from pollen.core.dataspec import check_model_fits, data_spec, model_input
from pollen.core.files import atomic_write_json
from pollen.core.paths import cache_dir
from pollen.core.protection import NODE_ATTACKS, DPSettings
from pollen.core.settings import RunSettings, Scalar, SettingsError
from pollen.tools import board, preflight
from pollen.tools.diagnosis import no_space
from pollen.tools.follow import START_TIMEOUT, follow
from pollen.tools.local_federation import (
    TLS,
    LocalFederation,
    allow_list,
    load_certificate,
    node_key,
    tls_args_superlink,
)
from pollen.tools.node_service import app_runner_argv, runner_secret, serve_node, supernode_argv
from pollen.tools.processes import DiskFull, LaunchError, bin_path, free_port


# ---- settings from the command line ----------------------------------------------------------
def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algorithm", help="algorithm (see `pollen algorithms`)")
    p.add_argument("--dataset", help="dataset (see `pollen datasets`)")
    p.add_argument("--clients", type=int, help="number of clients (data partitions)")
    p.add_argument("--rounds", type=int, help="number of rounds")
    p.add_argument("--out", help="results directory (default: results/<algorithm>-<time>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other run setting (see `pollen settings`); repeatable",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its last checkpoint"
    )
    p.add_argument(
        "--timeout", type=float, default=24 * 3600, help="stop the run after this many seconds"
    )
    p.add_argument(
        "--start-timeout",
        type=_seconds,
        default=START_TIMEOUT,
        metavar="S",
        help="stop the run when its ServerApp has written nothing this many seconds after the "
        "submission (it cannot start)",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="progress as plain lines (for logs and CI; the default when the output is not a "
        "terminal) instead of a live progress display",
    )
    p.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write per-round server and client metrics for TensorBoard to DIR/<results "
        "directory name> (needs pollen[tensorboard]); `tensorboard --logdir DIR` shows them",
    )


class NothingToDo(Exception):
    """The command has nothing to do (a resume of a run that already completed every round):
    said in one line, exit 0, nothing started or written."""


RUN_FLAGS = (
    ("algorithm", "algorithm"),
    ("dataset", "dataset"),
    ("clients", "num-clients"),
    ("rounds", "num-rounds"),
)
"""Flags that set a run setting: (flag, setting)."""


def resolve_run_settings(
    args: argparse.Namespace, local: bool = True, require_all: bool = True
) -> dict[str, Scalar]:
    """Settings of a new or resumed run, every value checked before anything starts, and the
    results directory checked (and, for a resume, its checkpoint) before anything is written.
    `local`: the clients run on this machine (deploy, simulate), so its devices count.
    `require_all`: min-available-clients defaults to every client; otherwise to the setting's
    own default (the run waits for every client, but starts without those seen to be lost:
    server.engine.Engine.wait_for_clients)."""
    _check_tensorboard(getattr(args, "tensorboard", None))
    overrides: dict[str, Any] = settings_mod.parse_assignments(args.set)
    declared = runconfig.all_settings()
    for flag, key in RUN_FLAGS:
        value = getattr(args, flag)
        if value is None:
            continue
        if key in overrides and key in declared:
            given = declared[key].coerce(overrides[key])
            if given != declared[key].coerce(value):
                raise SettingsError(
                    f"--{flag} {value} and --set {key}={overrides[key]} disagree: give one"
                )
        overrides[key] = value
    base: dict[str, Any] = {}
    if args.resume:
        if not args.out:
            raise SettingsError("--resume needs --out DIR, the directory of the run to continue")
        saved = Path(args.out) / rundir.CONFIG
        if not saved.is_file():
            raise SettingsError(f"--resume: {saved} not found (nothing to resume)")
        try:
            base = json.loads(saved.read_text())
        except (OSError, ValueError) as exc:
            raise SettingsError(f"--resume: {saved} is unreadable ({exc})") from None
        overrides["resume"] = True
    else:
        overrides.setdefault("resume", False)
    resolved = runconfig.resolve(overrides, base)
    run = RunSettings.of(resolved)
    foreign = runconfig.foreign_settings(run.algorithm, overrides)
    for key, owners in foreign.items():
        raise SettingsError(
            f"setting '{key}' is not read by {run.algorithm}; it belongs to {', '.join(owners)}"
        )
    if local:
        _check_device(run.device)
    out = (
        Path(args.out)
        if args.out
        else Path("results") / (f"{run.algorithm}-{run.dataset}-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    preflight.check_writable_dir(out, "--out")
    preflight.check_free_space(out, "--out")
    if not args.resume and (out / rundir.CHECKPOINT).exists():
        raise SettingsError(
            f"{out} already holds a run; pass --resume to continue it or choose another --out"
        )
    resolved["out-dir"] = str(out.resolve())
    if not run.run_name:
        resolved["run-name"] = f"{out.name}-{int(time.time())}"
    given = "min-available-clients" in overrides or "min-available-clients" in base
    if require_all and not given:
        resolved["min-available-clients"] = run.num_clients
    if args.resume:
        _check_resumable(out, resolved)
    _check_data(resolved)
    return resolved


@dataclasses.dataclass(frozen=True)
class Watch:
    """How a run is followed: the progress view and the TensorBoard directory."""

    plain: bool | None = None
    """True: plain lines; None: plain unless the output is a terminal (pollen.tools.progress)."""
    tensorboard: Path | None = None
    """TensorBoard writes to this directory's subdirectory named after the results one."""
    start_timeout: float = START_TIMEOUT
    """Seconds the ServerApp may take to start (pollen.tools.follow.follow)."""

    @classmethod
    def of(cls, args: argparse.Namespace) -> Watch:
        board = getattr(args, "tensorboard", None)
        start = getattr(args, "start_timeout", START_TIMEOUT)
        return cls(
            plain=True if getattr(args, "plain", False) else None,
            tensorboard=Path(board) if board else None,
            start_timeout=start,
        )


def _check_tensorboard(directory: str | None) -> None:
    """`--tensorboard DIR`: the package is installed and DIR can be written, before anything
    starts."""
    if not directory:
        return
    reason = board.missing()
    if reason is not None:
        raise SettingsError(reason)
    preflight.check_writable_dir(Path(directory), "--tensorboard")


def _check_device(device: str) -> None:
    """A CUDA device asked for must exist here (`auto` takes CUDA only when there is one)."""
    if not device.startswith("cuda"):
        return
    import torch  # lazy: torch

    if not torch.cuda.is_available():
        raise SettingsError(
            f"device={device}: torch sees no CUDA GPU on this machine; use device=auto or cpu"
        )


def _check_resumable(out: Path, resolved: dict[str, Scalar]) -> None:
    """The checkpoint to resume from is whole and was written with these settings: the checks
    the ServerApp makes, made before anything starts."""
    from server import checkpoint  # lazy: only on this path (--resume)

    try:
        saved = checkpoint.load(out)
        checkpoint.check_compatible(saved.settings, resolved)
    except checkpoint.CheckpointError as exc:
        raise SettingsError(f"--resume: {exc}") from None
    rounds = RunSettings.of(resolved).num_rounds
    if saved.server_round >= rounds and rundir.completed(out):
        raise NothingToDo(
            f"the run in {out} already completed its {rounds} rounds; nothing to resume "
            f"(to train further, resume it with --rounds above {rounds})"
        )


def _check_data(resolved: dict[str, Scalar]) -> None:
    """Dataset and partition parameters are checked, and the partition cached, up front."""
    from federated_data import (  # lazy: heavy data code
        DataConfigError,
        load_client_data,
        validate_spec,
    )

    try:
        spec = data_spec(resolved)
        validate_spec(spec)
        check_model_fits(resolved)
        shape, classes = model_input(resolved)
        from models import build_model  # lazy: torch

        model = build_model(RunSettings.of(resolved).model, shape, classes)  # it fits the data
        if DPSettings.of(resolved).enabled:
            from models.privacy import dp_compatible  # lazy: opacus

            dp_compatible(model)  # Opacus can train it (BatchNorm -> GroupNorm), or one line
        load_client_data(spec, 0, cache_dir(resolved))
    except (DataConfigError, ValueError) as exc:
        raise SettingsError(str(exc)) from None


# ---- commands ----------------------------------------------------------------------------
def cmd_deploy(args: argparse.Namespace) -> int:
    tls = TLS.from_dir(args.tls_dir) if args.tls_dir else None
    if args.auth and not tls:
        raise LaunchError("--auth (SuperNode authentication) needs TLS: give --tls-dir too")
    # a SuperNode whose hello is lost for good (or that never starts) does not stop the run:
    # `--set min-available-clients=N` requires N (docs/reliability.md#load)
    resolved = resolve_run_settings(args, require_all=False)
    run = RunSettings.of(resolved)
    _one_client_per_node(run)
    out, n = Path(run.out_dir), run.num_clients
    gpus = _deploy_gpus(args.gpus, run.device)
    attack = _attack_node_config(args)
    attackers = _attack_nodes(args, n) if attack else []
    keys = [node_key(args.tls_dir, i) for i in range(n)] if args.auth else []
    # a SuperNode that dies is restarted on its partition and state (docs/reliability.md)
    fed = LocalFederation(
        out / rundir.PROCESSES,
        restart_nodes=True,
        events=out / rundir.EVENTS,
        resident_workers=not args.no_worker,
        # one worker for the machine's nodes unless each must see its own GPU
        shared_worker=not (args.worker_per_node or gpus),
        # never restarted by this command, and a resume starts a fresh one: nothing for a
        # database file to keep, and no SQLite lock under many SuperNodes
        superlink_database=Path(args.superlink_database) if args.superlink_database else False,
    )
    fed.spread_task_polls(n + 1)  # the nodes' SuperExecs and the ServerApp's
    security = ("with TLS" if tls else "insecure") + (" and node authentication" if keys else "")
    print(
        f"Pollen deploy: {run.algorithm} on {run.dataset}, {n} clients, "
        f"{run.num_rounds} rounds, gRPC {security}; results in {out}",
        flush=True,
    )
    try:
        fed.sign_apps_with_new_key()  # its SuperNodes run only what this command submits
        _, fleet_port = fed.start_superlink(tls=tls, auth=bool(keys))
        fed.register_nodes([key.with_suffix(".pub") for key in keys])
        for i in range(n):
            # the partition cache follows the run's cache-dir setting, which nodes also read
            fed.start_supernode(
                i, n, f"127.0.0.1:{fleet_port}", tls=tls, auth_key=keys[i] if keys else None,
                node_config={"state-dir": str(out / "client-state"),
                             **(attack if i in attackers else {})},
                env_extra=gpu_environment(gpus, i),
            )  # fmt: skip
        if attackers:
            _warn(f"SuperNodes {attackers} attack the run ({attack['attack']}, --attack)")
        print(f"waiting for {n} SuperNodes to connect to the SuperLink", flush=True)
        fed.wait_nodes(n)
        print(f"SuperLink and {n} SuperNodes up (logs in {fed.workdir})", flush=True)
        if gpus:
            spread = ", ".join(f"{i}: GPU {gpus[i % len(gpus)]}" for i in range(n))
            print(f"SuperNodes on GPUs (CUDA_VISIBLE_DEVICES) {spread}", flush=True)
        return _run_and_report(fed, resolved, args.timeout, Watch.of(args))
    finally:
        fed.stop()


def _attack_nodes(args: argparse.Namespace, n: int) -> list[int]:
    """The SuperNodes `--attack` applies to: the last --attack-nodes of the n."""
    k = args.attack_nodes
    if not 1 <= k < n:
        raise LaunchError(f"--attack-nodes must be between 1 and {n - 1} (the clients), not {k}")
    return list(range(n - k, n))


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.parallel < 1:
        raise SettingsError(
            f"--parallel (clients trained at once) must be 1 or more, not {args.parallel}"
        )
    ray_address = _ray_address(args.ray_address)
    # on an existing Ray cluster the clients train on its nodes: this machine's devices do not
    # count (the cluster's nodes declare their GPUs to Ray)
    resolved = resolve_run_settings(args, local=ray_address is None)
    nodes = _simulation_nodes(args, resolved, ray_address is not None)
    resolved["simulation-nodes"] = nodes
    run = RunSettings.of(resolved)
    out, n = Path(run.out_dir), run.num_clients
    num_gpus = _simulation_gpus(args.gpus_per_client, run.device, ray_address is not None)
    fed = LocalFederation(out / rundir.PROCESSES)
    # the SuperLink's environment reaches the simulation process, whose ray.init() reads it;
    # "local": a Ray instance of its own, never a cluster `ray start` left on this machine
    fed.env["RAY_ADDRESS"] = ray_address or "local"
    where = f" on the Ray cluster at {ray_address}" if ray_address else ""
    gpu = f", {args.gpus_per_client:g} GPU per client" if args.gpus_per_client > 0 else ""
    print(
        f"Pollen simulate: {run.algorithm} on {run.dataset}, {n} clients on {nodes} simulated "
        f"SuperNodes, {run.num_rounds} rounds{gpu}{where}; results in {out}",
        flush=True,
    )
    try:
        fed.start_superlink(simulation=True)
        # on a cluster a client reserves one CPU and Ray packs as many as its nodes hold
        cpus = 1 if ray_address else max(1, (os.cpu_count() or 1) // max(1, args.parallel))
        fed.configure_simulation(nodes, cpus, args.gpus_per_client, num_gpus)
        return simulate_run(fed, resolved, args.timeout, Watch.of(args))
    finally:
        fed.stop()


NODES_PER_PARALLEL_CLIENT = 4
"""`pollen simulate`'s default packing: simulated SuperNodes per client trained at once, so that
a phase's clients spread evenly over Ray's workers..."""
CLIENTS_PER_NODE = 16
"""... and at most this many clients per node, so that a node's message (its clients'
instructions and replies, which its ClientApp holds at once) stays small as clients grow..."""
MOST_NODES = 64
"""... up to this many nodes: Flower's simulation engine looks for each node's messages by
scanning all of them (every 0.1 s), a cost that grows with the square of the nodes (about 20 ms
per node and phase at 256 nodes on 2 cores)."""
NODES_ON_A_CLUSTER = 256
"""The default packing's least simulated SuperNodes on a Ray cluster, whose size is its own."""


def _simulation_nodes(args: argparse.Namespace, resolved: dict[str, Scalar], cluster: bool) -> int:
    """The simulated SuperNodes the run's clients are packed onto (README, Simulation at scale):
    --nodes, else a simulation-nodes setting given, else NODES_PER_PARALLEL_CLIENT per
    --parallel (on a cluster NODES_ON_A_CLUSTER) or one per CLIENTS_PER_NODE clients up to
    MOST_NODES, whichever is more, at most one per client; checked before start-up."""
    run = RunSettings.of(resolved)
    n = run.num_clients
    given = "simulation-nodes" in settings_mod.parse_assignments(args.set)
    if args.nodes is not None:
        if given and run.simulation_nodes != args.nodes:
            raise SettingsError(
                f"--nodes {args.nodes} and --set simulation-nodes={run.simulation_nodes} "
                "disagree: give one"
            )
        nodes = args.nodes
    elif given or (args.resume and run.simulation_nodes):
        nodes = run.simulation_nodes
    else:
        least = NODES_ON_A_CLUSTER if cluster else NODES_PER_PARALLEL_CLIENT * args.parallel
        nodes = min(n, max(least, min(math.ceil(n / CLIENTS_PER_NODE), MOST_NODES)))
    if not 1 <= nodes <= n:
        raise SettingsError(
            f"--nodes {nodes}: the simulated SuperNodes must number from 1 to the run's {n} "
            "clients (each hosts at least one)"
        )
    return nodes


def _one_client_per_node(run: RunSettings) -> None:
    if run.simulation_nodes:
        raise SettingsError(
            f"simulation-nodes={run.simulation_nodes} packs clients onto simulated SuperNodes "
            "(pollen simulate); a deployed SuperNode serves one client: set it to 0"
        )


# ---- GPUs and Ray clusters (docs/deployment.md#gpu) --------------------------------------------
def cuda_devices() -> int:
    """How many CUDA GPUs torch sees on this machine (0 without CUDA)."""
    import torch  # lazy: torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _simulation_gpus(per_client: float, device: str, on_cluster: bool) -> int | None:
    """Checks `--gpus-per-client` against the run's device and this machine's GPUs before
    anything starts; returns the GPUs the local Ray instance is to offer (None: on a cluster,
    or none asked for)."""
    if not per_client >= 0 or per_client == float("inf"):
        raise SettingsError(f"--gpus-per-client must be 0 or more, not {per_client:g}")
    if per_client == 0:
        if device == "cuda":
            raise SettingsError(
                "device=cuda in simulation needs --gpus-per-client above 0: Ray hides the GPUs "
                "from clients that reserve none"
            )
        return None
    if device == "cpu":
        raise SettingsError(
            f"--gpus-per-client {per_client:g} with device=cpu: the clients would reserve GPUs "
            "and not use them; use device=auto or cuda, or drop --gpus-per-client"
        )
    if per_client > 1 and not float(per_client).is_integer():
        raise SettingsError(
            f"--gpus-per-client {per_client:g}: Ray takes a fraction of one GPU or a whole "
            "number of GPUs per client"
        )
    if on_cluster:
        return None
    count = cuda_devices()
    if count == 0:
        raise SettingsError(
            f"--gpus-per-client {per_client:g}: torch sees no CUDA GPU on this machine "
            "(drop the option to train on the CPU, or --ray-address a cluster with GPUs)"
        )
    if per_client > count:
        raise SettingsError(
            f"--gpus-per-client {per_client:g}: this machine has {count} CUDA GPU"
            f"{'s' if count > 1 else ''}"
        )
    return count


def _ray_address(given: str | None) -> str | None:
    """The Ray cluster a simulation joins: --ray-address, else RAY_ADDRESS from the
    environment (Ray's own variable), as the GCS address HOST:PORT of the cluster's head; it
    must answer. RAY_ADDRESS=auto (Ray's: the cluster `ray start` runs on this machine) is
    passed on as it is. None: a Ray instance of the simulation's own."""
    address = given if given is not None else os.environ.get("RAY_ADDRESS", "")
    option = "--ray-address" if given is not None else "RAY_ADDRESS"
    if given is None and address in ("", "local"):
        return None
    if given is None and address == "auto":
        return address
    try:
        if "://" in address:  # ray:// is Ray Client's port, not the cluster's GCS address
            raise LaunchError(address)
        host, port = _host_port(address, option)
    except LaunchError:
        raise SettingsError(
            f"{option} {address!r} is not HOST:PORT, the address of the Ray cluster's head "
            "node (`ray start --head --port PORT` prints it), e.g. 10.0.0.5:6379"
        ) from None
    import socket  # lazy: only on this path

    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        raise LaunchError(
            f"{option} {address}: no Ray cluster answers there ({exc.strerror or exc}); start "
            "one with `ray start --head --port PORT` on its head node"
        ) from None
    return address


def _deploy_gpus(text: str | None, device: str) -> list[int]:
    """The CUDA devices of `pollen deploy --gpus 0,1`, checked against the run's device and
    the GPUs torch sees here ([] without the option)."""
    if text is None:
        return []
    try:
        gpus = [int(part) for part in text.split(",")]
    except ValueError:
        raise SettingsError(
            f"--gpus {text!r}: expected GPU indices separated by commas, e.g. 0,1"
        ) from None
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise SettingsError(f"--gpus {text}: indices must be distinct and 0 or more")
    if device == "cpu":
        raise SettingsError(
            f"--gpus {text} with device=cpu: the SuperNodes would not use them; use device=auto "
            "or cuda, or drop --gpus"
        )
    _check_gpus_present(f"--gpus {text}", max(gpus))
    return gpus


def _check_gpus_present(option: str, highest: int) -> None:
    count = cuda_devices()
    if count <= highest:
        seen = (
            "torch sees no CUDA GPU on this machine"
            if count == 0
            else f"torch sees {count} CUDA GPU{'s' if count > 1 else ''} here (0 to {count - 1})"
        )
        raise LaunchError(f"{option}: {seen}")


def gpu_environment(gpus: Sequence[int], index: int) -> dict[str, str]:
    """SuperNode `index`'s CUDA_VISIBLE_DEVICES: the listed GPUs round-robin ({} for none).
    Its ClientApps then see that one GPU as cuda:0."""
    if not gpus:
        return {}
    return {"CUDA_VISIBLE_DEVICES": str(gpus[index % len(gpus)])}


RUNTIME_START_ATTEMPTS = 3
RUNTIME_START_FAILURE = "timed out during startup"
"""Ray's message when its node does not come up within its fixed 30 s (a loaded machine)."""


def simulate_run(
    fed: LocalFederation,
    resolved: dict[str, Scalar],
    timeout: float,
    watch: Watch = Watch(),
    pause: float = 10.0,
) -> int:
    """A run on the simulation runtime, submitted again (at most RUNTIME_START_ATTEMPTS times in
    all) when Ray's runtime did not start. That failure comes before any client has answered,
    so the next attempt starts from where this one did (the beginning or the checkpoint it
    resumed from)."""
    run = RunSettings.of(resolved)
    out = Path(run.out_dir)
    for attempt in range(1, RUNTIME_START_ATTEMPTS):
        code = _run_and_report(fed, resolved, timeout, watch)
        log = out / rundir.SERVER_LOG
        if code == 0 or not log.exists():
            return code
        if RUNTIME_START_FAILURE not in log.read_text(errors="replace"):
            return code
        log.replace(out / f"server-attempt{attempt}.log")
        if not run.resume:  # what the failed attempt wrote; a resume keeps its history
            for name in (rundir.EVENTS, rundir.SUMMARY):
                (out / name).unlink(missing_ok=True)
        print(
            f"the simulation runtime did not start (attempt {attempt} of "
            f"{RUNTIME_START_ATTEMPTS}, log in server-attempt{attempt}.log); submitting again",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(pause)
    return _run_and_report(fed, resolved, timeout, watch)


def cmd_run(args: argparse.Namespace) -> int:
    """Submit a run to a SuperLink that is already running (multi-machine deployment)."""
    _host_port(args.superlink, "--superlink")
    signing_key = _signing_key(args.signing_key)
    resolved = resolve_run_settings(args, local=False)
    _one_client_per_node(RunSettings.of(resolved))
    out = Path(RunSettings.of(resolved).out_dir)
    fresh = not out.exists()
    fed = LocalFederation(out / rundir.PROCESSES, signing_key=signing_key)
    fed.write_connection(
        args.superlink, Path(args.root_certificates) if args.root_certificates else None
    )
    print(f"waiting for the SuperLink at {args.superlink}", flush=True)
    try:
        fed.wait_reachable(args.superlink, args.wait_superlink)
    except (LaunchError, KeyboardInterrupt):
        if fresh:  # nothing was submitted: leave no directory behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    return _run_and_report(fed, resolved, args.timeout, Watch.of(args))


def _signing_key(path: str | None) -> Path | None:
    """The operator's private key for `pollen run`, read once here so that a bad one stops the
    command before anything is submitted."""
    from pollen.tools.signing import SigningError, load_private_key  # lazy: cryptography

    if not path:
        _warn(
            "no --signing-key: the run is submitted unsigned, and SuperNodes started with "
            "--trusted-key will refuse to run it"
        )
        return None
    try:
        load_private_key(Path(path))
    except SigningError as exc:
        raise LaunchError(str(exc)) from None
    return Path(path).resolve()


def _failure(out: Path, status: Mapping[str, Any]) -> str:
    """One line saying why a run did not complete: the ServerApp's reason from summary.json
    (or resume-failed.json), else Flower's status, and where the full log is."""
    from server.results import brief  # lazy: only on this path

    reason = ""
    for name in (rundir.RESUME_FAILED, rundir.SUMMARY):
        record = rundir.summary_of(out, name) or {}
        if record.get("status") == rundir.FAILED and record.get("reason"):
            reason = str(record["reason"])
            break
    if not reason:
        reason = f"{status.get('status', 'unknown')}: {status.get('status-details', '')}"
    return f"failed: {brief(reason, limit=600)} (full log: {out / rundir.SERVER_LOG})"


def _no_space(out: Path, detail: str) -> str:
    """The line for a run stopped by a full disk: where, what is kept, how to go on."""
    from server import checkpoint  # lazy: only on this path

    try:
        kept = checkpoint.load(out).server_round
    except checkpoint.CheckpointError:
        kept = 0
    then = (
        f"its checkpoint of round {kept} is kept: free space, then continue it with --resume "
        f"--out {out}"
        if kept
        else "no round was saved: free space, then start it again"
    )
    if not detail.startswith("no space left on device"):
        detail = (
            f"no space left on device in {out} ({preflight.free_mb(out):.1f} MB free; {detail})"
        )
    return f"{detail}; the run was stopped and {then}"


def _record_restarts(summary_path: Path, restarts: list[dict[str, Any]]) -> None:
    """Add the SuperNode restarts of this run to the summary the ServerApp wrote."""
    summary = rundir.summary_of(summary_path.parent)
    if summary is None:
        return  # no summary to add to: the events file has them
    summary["node-restarts"] = [*summary.get("node-restarts", []), *restarts]
    atomic_write_json(summary_path, summary)


def _run_and_report(
    fed: LocalFederation, resolved: dict[str, Scalar], timeout: float, watch: Watch = Watch()
) -> int:
    run = RunSettings.of(resolved)
    out = Path(run.out_dir)
    sinks = []
    if watch.tensorboard is not None:  # before the run: the writer imports torch (seconds)
        log_dir = watch.tensorboard / out.name
        sinks.append(board.Board(log_dir, run.num_rounds, run.algorithm))
        print(f"TensorBoard: {log_dir} (tensorboard --logdir {watch.tensorboard})", flush=True)
    try:
        run_id = fed.submit(resolved)
    except BaseException:
        for sink in sinks:
            sink.close(None)
        raise
    print(f"run {run_id} submitted", flush=True)
    try:
        status = follow(
            fed, run_id, out, timeout, num_rounds=run.num_rounds, history=run.resume,
            plain=watch.plain, sinks=sinks, start_timeout=watch.start_timeout,
        )  # fmt: skip
    except KeyboardInterrupt:
        fed.stop_run(run_id)
        raise
    except DiskFull as exc:
        print(f"pollen: error: run {run_id}: {_no_space(out, str(exc))}", file=sys.stderr)
        return 1
    log = fed.server_log(run_id)
    with contextlib.suppress(OSError):  # a full disk: said below
        (out / rundir.SERVER_LOG).write_text(log)
    if fed.restart_log:
        _record_restarts(out / rundir.SUMMARY, fed.restart_log)
    state = status.get("status", "unknown")
    lost = fed.lost_messages()  # what Flower's processes logged about messages they lost
    if state != "finished:completed":
        if no_space(log) or preflight.free_mb(out) < 1:
            print(f"pollen: error: run {run_id}: {_no_space(out, 'the ServerApp could not write')}",
                  file=sys.stderr)  # fmt: skip
            return 1
        cause = f"; {lost}" if lost else ""
        print(f"pollen: error: run {run_id} {_failure(out, status)}{cause}", file=sys.stderr)
        return 1
    if lost:
        print(f"pollen: note: Flower lost messages on the way, and the run went on: {lost}")
    summary = rundir.summary_of(out)
    if summary is not None:
        final = (summary.get("final") or {}).get("eval") or {}
        if "test-accuracy" in final:
            print(
                f"final: mean client test-accuracy {final['test-accuracy']:.4f} "
                f"(10th percentile {final.get('test-accuracy-p10', float('nan')):.4f})"
            )
    print(f"run {run_id} completed; results in {out}")
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    """Run a SuperLink in the foreground: clients connect to --fleet-port (gRPC)."""
    tls = _transport_security(args.tls_dir, args.insecure, "--tls-dir DIR")
    if args.auth and not tls:
        raise LaunchError("--auth (SuperNode authentication) needs TLS: give --tls-dir too")
    if args.allow_list and not args.auth:
        raise LaunchError("--allow-list is for --auth: give both")
    api_host = _api_host(args)
    secret = _superexec_secret(args)
    _check_server_machine(args, api_host)
    for line in _server_warnings(args, api_host, secret):
        print(f"pollen: warning: {line}", file=sys.stderr, flush=True)
    return _serve_supervised(superlink_argv(args, tls), args, tls)


def _check_server_machine(args: argparse.Namespace, api_host: str) -> None:
    """What this machine must offer the SuperLink, checked before it starts: its two ports
    free, its database's directory there and writable, the files and directories it is given
    usable (docs/reliability.md#operator-mistakes)."""
    if args.database:
        preflight.check_database(args.database)
    if args.workdir:
        preflight.check_writable_dir(Path(args.workdir), "--workdir")
    if args.ready_file:
        preflight.check_writable_dir(Path(args.ready_file).parent, "--ready-file")
    if args.allow_list:
        preflight.check_input_dir(Path(args.allow_list), "--allow-list")
    if args.port == args.fleet_port:
        raise LaunchError(
            f"--port and --fleet-port are both {args.port}: the HTTP API and the Fleet API "
            "need a port each"
        )
    preflight.check_port_free(api_host, args.port, "--port")
    preflight.check_port_free(args.fleet_host, args.fleet_port, "--fleet-port")


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _transport_security(tls_dir: str | None, insecure: bool, option: str) -> TLS | None:
    """TLS from `tls_dir`, or None when the operator said --insecure; neither is an error."""
    if tls_dir and insecure:
        raise LaunchError(f"{option} and --insecure contradict each other: give one")
    if tls_dir:
        return TLS.from_dir(tls_dir)
    if not insecure:
        raise LaunchError(
            f"no TLS material: give {option} (scripts/generate-certs.sh makes it), or "
            "--insecure to run unencrypted on a network you trust"
        )
    return None


def _api_host(args: argparse.Namespace) -> str:
    """The interface of the SuperLink's HTTP API: loopback unless --expose-api."""
    if args.expose_api:
        return "0.0.0.0"
    if args.api_host not in LOOPBACK_HOSTS:
        raise LaunchError(
            f"--api-host {args.api_host} would expose the HTTP API (whoever reaches it can "
            "submit a run, i.e. run code on every client): add --expose-api to mean it"
        )
    return str(args.api_host)


def _superexec_secret(args: argparse.Namespace) -> Path | None:
    if not args.superexec_auth_secret_file:
        return None
    if args.isolation != "process":
        raise LaunchError(
            "--superexec-auth-secret-file is for --isolation process (a separate SuperExec "
            "runs the ServerApp)"
        )
    secret = Path(args.superexec_auth_secret_file)
    try:
        if not secret.read_bytes():
            raise LaunchError(f"SuperExec secret file {secret} is empty")
    except OSError as exc:
        raise LaunchError(
            f"SuperExec secret file {secret} cannot be read: {exc.strerror}"
        ) from None
    return secret.resolve()


def _server_warnings(args: argparse.Namespace, api_host: str, secret: Path | None) -> list[str]:
    """One line per thing this SuperLink lets others do that the operator should know of."""
    lines = []
    if args.insecure:
        lines.append(
            "--insecure: SuperNodes and the flwr CLI talk to this SuperLink unencrypted; "
            "anyone on the network path can read and alter models, updates and runs"
        )
    if not args.auth:
        lines.append(
            f"no --auth: any machine that reaches the Fleet API ({args.fleet_host}:"
            f"{args.fleet_port}) can join as a client, receive the global model and send updates"
        )
    if args.expose_api:
        lines.append(
            f"--expose-api: anyone who reaches port {args.port} on this machine can submit a "
            "run, i.e. run code in the ServerApp and on every client (Flower's Control API "
            "authenticates no caller)"
        )
    if args.isolation == "process" and secret is None:
        lines.append(
            "--isolation process without --superexec-auth-secret-file: any process that "
            f"reaches {api_host}:{args.port} can claim the ServerApp's work"
        )
    return lines


def superlink_argv(args: argparse.Namespace, tls: TLS | None) -> list[str]:
    """The `flower-superlink` command line `pollen server` runs."""
    argv = [
        "flower-superlink",
        "--host",
        _api_host(args),
        "--port",
        str(args.port),
        "--fleet-api-type",
        "grpc-rere",
        "--fleet-api-address",
        f"{args.fleet_host}:{args.fleet_port}",
        "--disable-runtime-dependency-installation",
        "--isolation",
        args.isolation,
        *tls_args_superlink(tls),
    ]
    if args.database:  # (the SuperLink runs in its work directory: the path must be absolute)
        memory = args.database == ":memory:"
        argv += ["--database", args.database if memory else str(Path(args.database).resolve())]
    if args.auth:
        argv.append("--enable-supernode-auth")
    if args.superexec_auth_secret_file:
        secret = Path(args.superexec_auth_secret_file).resolve()
        argv += ["--superexec-auth-secret-file", str(secret)]
    return argv


def _serve_supervised(argv: list[str], args: argparse.Namespace, tls: TLS | None) -> int:
    """Run the SuperLink as a child; once it answers, register the allow-list's keys (those
    this database does not hold yet) and write --ready-file; then stay in the foreground until
    it exits (Ctrl-C or SIGTERM stop it)."""
    keys = allow_list(args.allow_list) if args.allow_list else []
    ready = Path(args.ready_file) if args.ready_file else None
    if ready is not None:
        ready.unlink(missing_ok=True)  # a restarted server is not ready until it says so again
    scratch = None if args.workdir else Path(tempfile.mkdtemp(prefix="superlink-"))
    fed = LocalFederation(scratch or Path(args.workdir))
    print("starting:", " ".join(argv), flush=True)
    proc = fed.spawn("superlink", [bin_path(argv[0]), *argv[1:]], console=True)
    try:
        local = "127.0.0.1" if args.expose_api else _api_host(args)
        scheme = "https" if tls else "http"
        fed.wait_health(f"{scheme}://{local}:{args.port}/health", proc, tls)
        fed.write_connection(f"{local}:{args.port}", tls.ca_cert if tls else None)
        if keys:
            record = Path(f"{args.database}.registered-keys") if args.database else None
            added = fed.register_nodes(keys, record)
            print(
                f"allow-list: {len(keys)} SuperNode keys from {args.allow_list} "
                f"({added} newly registered)",
                flush=True,
            )
        if ready is not None:
            ready.parent.mkdir(parents=True, exist_ok=True)
            ready.write_text(f"{os.getpid()}\n")
        try:
            code = proc.popen.wait()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: a clean stop (as `pollen client`'s)
            print("pollen: stopping the SuperLink", file=sys.stderr, flush=True)
            return 0
        if code != 0:
            raise proc.failure()
        return 0
    finally:
        if ready is not None:
            ready.unlink(missing_ok=True)
        fed.stop()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def cmd_client(args: argparse.Namespace) -> int:
    """Run a SuperNode in the foreground with this machine's partition, data and state."""
    _host_port(args.superlink, "--superlink")
    if args.num_partitions < 1 or not 0 <= args.partition_id < args.num_partitions:
        raise LaunchError(
            f"--partition-id {args.partition_id} is not one of the {args.num_partitions} "
            f"partitions (0 to {args.num_partitions - 1}; --num-partitions)"
        )
    if args.max_wait_time <= 0:
        raise LaunchError(f"--max-wait-time must be positive, not {args.max_wait_time:g}")
    if args.root_certificates and args.insecure:
        raise LaunchError("--root-certificates and --insecure contradict each other: give one")
    gpu: dict[str, str] = {}
    if args.gpu is not None:
        if args.gpu < 0:
            raise LaunchError(f"--gpu must be a GPU index, 0 or more, not {args.gpu}")
        _check_gpus_present(f"--gpu {args.gpu}", args.gpu)
        gpu = gpu_environment([args.gpu], 0)
    if not args.root_certificates and not args.insecure:
        raise LaunchError(
            "no TLS material: give --root-certificates CA.crt (the SuperLink's CA), or "
            "--insecure to connect unencrypted on a network you trust"
        )
    trusted = _trusted_key(args)
    _check_client_machine(args)
    if args.insecure:
        _warn(
            "--insecure: the model and this client's updates travel unencrypted; anyone on "
            "the network path can read and alter them"
        )
    if trusted is None:
        _warn(
            "--allow-any-app: this machine runs the code of any app the SuperLink hands it, "
            "whoever submitted it"
        )
    port = args.port if args.port is not None else free_port()
    secret = runner_secret(Path(args.state_dir).resolve() / ".app-runner") if trusted else None
    argv = supernode_argv_of(args, port=port, runner_secret=secret)
    if not args.wait_forever:
        argv += ["--max-wait-time", f"{args.max_wait_time:g}"]
    runner = None
    if trusted is not None and secret is not None:
        key, secret_file = trusted, secret

        def runner(pid: int) -> list[str]:
            return app_runner_argv(f"127.0.0.1:{port}", key, pid, secret_file)

    waited = None if args.wait_forever else args.max_wait_time
    worker = None
    if not args.no_worker:  # one node per (state directory, partition) on this machine
        try:
            worker = resident.socket_path(f"{Path(args.state_dir).resolve()}#{args.partition_id}")
        except resident.WorkerUnavailable as exc:
            raise LaunchError(f"cannot place the node's worker socket: {exc}") from None
    return serve_node(argv, runner, args.superlink, waited, env_extra=gpu, worker_socket=worker)


def _check_client_machine(args: argparse.Namespace) -> None:
    """What this machine must offer the SuperNode, checked before it starts (not when its first
    message fails, on a machine nobody may be watching): a state directory it can write, the
    data directory there, its local port free, its certificate and key readable."""
    preflight.check_writable_dir(Path(args.state_dir), "--state-dir")
    if args.data_dir:
        preflight.check_input_dir(Path(args.data_dir), "--data-dir")
    if args.cache_dir:
        preflight.check_writable_dir(Path(args.cache_dir), "--cache-dir")
    if args.port is not None:
        preflight.check_port_free("127.0.0.1", args.port, "--port")
    if args.root_certificates:
        load_certificate(Path(args.root_certificates))
    if args.auth_key:
        _check_node_key(Path(args.auth_key))


def _check_node_key(path: Path) -> None:
    """`--auth-key`: a private key (OpenSSH or PEM, as scripts/generate-certs.sh --nodes makes
    them) that this process can read."""
    from pollen.tools.signing import SigningError, read_private_key  # lazy: cryptography

    preflight.check_readable_file(path, "--auth-key")
    try:
        read_private_key(path, "--auth-key")
    except SigningError as exc:
        raise LaunchError(
            f"{exc}; give this node's key (scripts/generate-certs.sh DIR --nodes N makes "
            "DIR/supernodes/node-I.key)"
        ) from None


def _warn(text: str) -> None:
    print(f"pollen: warning: {text}", file=sys.stderr, flush=True)


def _host_port(address: str, option: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 in brackets), checked before anything starts."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"{option} {address!r} is not HOST:PORT (e.g. server.example.org:9092)")
    return host, int(port)


def _trusted_key(args: argparse.Namespace) -> Path | None:
    """The operator's public key this node trusts apps from; None with --allow-any-app."""
    from pollen.tools.signing import SigningError, load_public_key  # lazy: cryptography

    if args.trusted_key and args.allow_any_app:
        raise LaunchError("--trusted-key and --allow-any-app contradict each other: give one")
    if not args.trusted_key:
        if not args.allow_any_app:
            raise LaunchError(
                "no --trusted-key: give the operator's public key (signing.pub from "
                "scripts/generate-certs.sh), so that this machine runs only apps the operator "
                "signed, or --allow-any-app to run whatever the SuperLink hands it"
            )
        return None
    path = Path(args.trusted_key).resolve()
    try:
        load_public_key(path)
    except SigningError as exc:
        raise LaunchError(str(exc)) from None
    return path


def supernode_argv_of(
    args: argparse.Namespace, port: int | None = None, runner_secret: Path | None = None
) -> list[str]:
    """The `flower-supernode` command line `pollen client` runs."""
    node: dict[str, Scalar] = {
        "partition-id": args.partition_id,
        "num-partitions": args.num_partitions,
        "state-dir": str(Path(args.state_dir).resolve()),
    }
    if args.data_dir:
        node["data-dir"] = str(Path(args.data_dir).resolve())
    if args.cache_dir:
        node["cache-dir"] = str(Path(args.cache_dir).resolve())
    node.update(_attack_node_config(args))
    return supernode_argv(
        args.superlink,
        port if port is not None else (args.port or 9094),
        node,
        Path(args.root_certificates) if args.root_certificates else None,
        Path(args.auth_key) if args.auth_key else None,
        host="127.0.0.1",
        runner_secret=runner_secret,
    )


def _attack_node_config(args: argparse.Namespace) -> dict[str, Scalar]:
    """The node config of `--attack` (a node that attacks the run, to evaluate robust rules;
    docs/robustness.md#attacks), checked here in one line; {} when none is asked for."""
    kind = getattr(args, "attack", None)
    if not kind:
        return {}
    scale = getattr(args, "attack_scale", 10.0)
    if not math.isfinite(scale) or scale < 0:
        raise LaunchError(f"--attack-scale must be finite and >= 0, not {scale:g}")
    return {"attack": kind, "attack-scale": scale}


def _add_attack_options(p: argparse.ArgumentParser, who: str) -> None:
    p.add_argument(
        "--attack",
        choices=NODE_ATTACKS,
        help=f"{who} attacks the run (evaluation of robust rules, docs/robustness.md#attacks): "
        "its training replies are changed (label-flip: its labels)",
    )
    p.add_argument(
        "--attack-scale",
        type=float,
        default=10.0,
        metavar="S",
        help="sign-flip sends -S x the honest update; model-replacement boosts by S",
    )


def cmd_report(args: argparse.Namespace) -> int:
    from pollen.tools.report import parse_formats, write_report  # lazy: only on this path
    from pollen.tools.runs import ReportError  # lazy: only on this path

    try:
        formats = parse_formats(args.format)
        out = write_report(
            [Path(d) for d in args.dirs], Path(args.out) if args.out else None, formats
        )
    except ReportError as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    print(f"report written to {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from pollen.tools.experiment import Experiment, run, tabulate  # lazy: only on this path

    exp = Experiment.load(Path(args.file))
    if args.seeds:
        try:
            seeds = tuple(int(s) for s in args.seeds.split(","))
        except ValueError:
            print(
                f"pollen: error: --seeds takes integers like 0,1,2, not {args.seeds!r}",
                file=sys.stderr,
            )
            return 2
        exp = dataclasses.replace(exp, seeds=seeds)
    if args.methods:
        chosen = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in chosen if m not in exp.methods]
        if unknown or not chosen:
            print(
                f"pollen: error: --methods: {', '.join(unknown) or 'none given'}; "
                f"{exp.name} has {', '.join(exp.methods)}",
                file=sys.stderr,
            )
            return 2
        exp = dataclasses.replace(exp, methods={m: exp.methods[m] for m in chosen})
    out = Path(args.out) if args.out else Path("results") / exp.name
    if args.table_only and not out.is_dir():
        print(f"pollen: error: --table-only: {out} holds no runs", file=sys.stderr)
        return 2
    runtime: list[str] = []
    if args.gpus_per_client is not None:
        runtime += ["--gpus-per-client", repr(args.gpus_per_client)]
    if args.parallel is not None:
        runtime += ["--parallel", str(args.parallel)]
    if runtime and exp.mode != "simulate":
        print(
            f"pollen: error: --gpus-per-client and --parallel are options of simulation; "
            f"{exp.name} runs in {exp.mode} mode",
            file=sys.stderr,
        )
        return 2
    table = tabulate(exp, out) if args.table_only else run(exp, out, runtime)
    print((out / "results.md").read_text())
    return 0 if table["methods"] else 1


def cmd_data_download(args: argparse.Namespace) -> int:
    """Fetch a torchvision dataset into a data directory (needs internet)."""
    from federated_data import DataConfigError, load_dataset  # lazy: heavy data code
    from federated_data.registry import dataset_param_names  # lazy: heavy data code

    try:
        if dataset_param_names(args.name):
            print(f"{args.name} is generated on the clients from the run settings; nothing to get")
            return 0
        source = load_dataset(args.name, args.data_dir, download=True)
    except DataConfigError as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    test = len(source.test) if source.test is not None else 0
    print(f"{args.name}: {len(source.train)} training and {test} test examples in {args.data_dir}")
    return 0


def cmd_data_summary(args: argparse.Namespace) -> int:
    """Show how a run's settings split the data: sizes and label counts per client, and with
    --plot the label distribution as stacked bars."""
    from federated_data import DataConfigError, partition_summary  # lazy: heavy data code

    plot = Path(args.plot) if args.plot else None
    if plot is not None:
        suffix = plot.suffix.lower().lstrip(".")
        if suffix not in ("png", "svg", "pdf"):
            print(
                f"pollen: error: --plot {plot}: the file must end in .png, .svg or .pdf",
                file=sys.stderr,
            )
            return 2
        preflight.check_writable_dir(plot.parent if str(plot.parent) else Path("."), "--plot")
    try:
        resolved = runconfig.resolve(settings_mod.parse_assignments(args.set))
        summary = partition_summary(data_spec(resolved), cache_dir(resolved))
    except (SettingsError, DataConfigError) as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(summary, indent=1 if args.json else None)
        if args.json
        else _format_partition(summary)
    )
    if plot is not None:
        from pollen.tools.plots import plot_partition  # lazy: matplotlib, only with --plot

        run = RunSettings.of(resolved)
        plot_partition(summary, plot, _partition_title(resolved, run))
        print(f"label distribution drawn to {plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _partition_title(resolved: Mapping[str, Scalar], run: RunSettings) -> str:
    from pollen.tools.runs import partition_text  # lazy: only on this path

    partition = partition_text(resolved) or run.partitioner
    return (
        f"{run.dataset}, {partition}, {run.num_clients} clients, seed {run.seed}: "
        "train labels per client"
    )


LABEL_TABLE_MOST = 20
"""`pollen data summary` shows label counts as columns up to this many labels; beyond, as
label:count pairs of the labels a client holds."""


def _format_partition(summary: dict[str, Any]) -> str:
    """Per client: its split sizes and how many training examples of each label it holds."""
    clients = [c for c in summary.get("clients", []) if isinstance(c, dict)]
    if not clients:
        return json.dumps(summary)
    labels = max(len(c.get("train_labels") or []) for c in clients)
    sizes = ("train", "val", "test")
    widths = {k: max(len(k), *(len(str(c.get(k, ""))) for c in clients)) for k in sizes}
    left = "client  " + "  ".join(f"{k:>{widths[k]}}" for k in sizes)
    columns = 0 < labels <= LABEL_TABLE_MOST
    width = max(3, *(len(str(n)) for c in clients for n in c.get("train_labels") or [0]))
    lines = [left]
    if columns:
        lines = [
            f"{left} | train examples of each label",
            f"{'':{len(left)}} | " + " ".join(f"{i:>{width}}" for i in range(labels)),
        ]
    elif labels:
        lines = [f"{left} | train examples of each label held (label:count)"]
    for client in clients:
        line = f"{client.get('client_id', '?'):>6}  " + "  ".join(
            f"{client.get(k, ''):>{widths[k]}}" for k in sizes
        )
        counts = list(client.get("train_labels") or [])
        if columns:
            counts += [0] * (labels - len(counts))
            line += " | " + " ".join(f"{n:>{width}}" for n in counts)
        elif labels:
            line += " | " + " ".join(f"{i}:{n}" for i, n in enumerate(counts) if n)
        lines.append(line)
    return "\n".join(lines)


def cmd_settings(args: argparse.Namespace) -> int:
    declared = runconfig.all_settings()
    if args.algorithm:
        runconfig.resolve({"algorithm": args.algorithm})  # an unknown one: named, with a hint
        foreign = runconfig.foreign_settings(args.algorithm, declared)
        declared = {k: v for k, v in declared.items() if k not in foreign}
    for key, s in declared.items():
        extra = f" one of: {', '.join(s.choices)}" if s.choices else ""
        print(f"{key:24s} {s.default!r:>12}  {s.help}{extra}")
    return 0


def cmd_algorithms(args: argparse.Namespace) -> int:
    for name, spec in sorted(registry.ALGORITHMS.items()):
        print(f"{name:12s} {spec.description}")
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    from federated_data.catalog import CATALOG  # lazy: heavy data code

    for name, info in CATALOG.items():
        print(f"{name:14s} input {info.input_shape}, {info.num_classes} classes")
    return 0


EXAMPLES = {
    "deploy": (
        "pollen deploy --algorithm fedem --dataset mnist-5k --clients 3 --rounds 5 --out "
        "results/fedem"
    ),
    "simulate": (
        "pollen simulate --algorithm fedavg --clients 20 --rounds 50 --set "
        "fraction-train=0.25\n  pollen simulate --algorithm fedavg --clients 8 --gpus-per-client "
        "0.25 --set amp=true"
    ),
    "run": (
        "pollen run --superlink 127.0.0.1:9093 --root-certificates certs/ca.crt "
        "--signing-key certs/signing.key --algorithm fedavg --clients 2 --rounds 20"
    ),
    "server": (
        "pollen server --tls-dir certs --auth --allow-list certs/supernodes --database superlink.db"
    ),
    "client": (
        "pollen client --superlink server.example.org:9092 --root-certificates ca.crt "
        "--auth-key node-0.key --trusted-key signing.pub --partition-id 0 "
        "--num-partitions 2"
    ),
    "report": "pollen report results/fedavg results/local --out results/compare",
    "experiment": (
        "pollen experiment experiments/fedem_synthetic.toml --seeds 0\n  pollen experiment "
        "experiments/fedem_cifar10.toml --methods fedem --gpus-per-client 0.5"
    ),
    "data": "pollen data summary --set dataset=mnist-5k --set num-clients=5",
    "download": "pollen data download cifar10 --data-dir ~/data",
    "summary": (
        "pollen data summary --set dataset=mnist-5k --set num-clients=5 --set partitioner=dirichlet"
    ),
    "settings": "pollen settings fedem",
    "algorithms": "pollen algorithms",
    "datasets": "pollen datasets",
}
"""One example per command, shown at the end of its --help."""


class _Help(argparse.RawDescriptionHelpFormatter):
    """--help with each option's default (where it has one) and the command's example kept as
    written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default in (None, False, [], argparse.SUPPRESS) or "%(default)" in text:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)"
        return text


def _command(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, formatter_class=_Help, epilog=f"example:\n  {EXAMPLES[name]}", **kwargs
    )
    return parser


def _add_worker_option(p: argparse.ArgumentParser, nodes: str) -> None:
    p.add_argument(
        "--no-worker",
        action="store_true",
        help=f"no resident worker beside {nodes}: each message's ClientApp process imports "
        "torch and loads the data itself (slower; less memory between messages)",
    )


class _Parser(argparse.ArgumentParser):
    """argparse's mistakes in Pollen's form: one line, `pollen: error: ...`, exit 2 (argparse
    prints the usage first, then `pollen COMMAND: error: ...`)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("pollen").strip()
        where = f"pollen {command} --help" if command else "pollen --help"
        self.exit(2, f"pollen: error: {message} (see {where})\n")


def _port(text: str) -> int:
    """argparse `type=` of a port option: 1 to 65535, or argparse's one line."""
    try:
        return preflight.port_number(text)
    except preflight.PreflightError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    """argparse `type=` of a duration: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pollen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_deploy(sub)
    _add_simulate(sub)
    _add_run(sub)
    _add_server(sub)
    _add_client(sub)
    _add_report(sub)
    _add_experiment(sub)
    _add_data(sub)
    _add_settings(sub)
    _add_listings(sub)
    return parser


def _add_deploy(sub: Any) -> None:
    """`pollen deploy`'s arguments."""
    p = _command(sub, "deploy", help="SuperLink + N SuperNodes as processes on loopback (gRPC)")
    _add_run_options(p)
    p.add_argument("--tls-dir", help="directory with ca.crt, server.pem, server.key")
    p.add_argument(
        "--auth",
        action="store_true",
        help="SuperNode authentication: node i signs with <tls-dir>/supernodes/node-i.key, "
        "the SuperLink accepts only the registered keys",
    )
    p.add_argument(
        "--gpus",
        metavar="LIST",
        help="CUDA GPUs for the SuperNodes, e.g. 0,1: node i gets GPU LIST[i mod len(LIST)] "
        "(CUDA_VISIBLE_DEVICES); default: every node sees every GPU",
    )
    _add_attack_options(p, "each of the --attack-nodes last SuperNodes")
    p.add_argument(
        "--attack-nodes",
        type=int,
        default=1,
        metavar="K",
        help="with --attack: how many SuperNodes attack (the last K; default 1)",
    )
    _add_worker_option(p, "every SuperNode")
    p.add_argument(
        "--superlink-database",
        metavar="FILE",
        help="keep the SuperLink's state in this SQLite file (to inspect it afterwards) instead "
        "of in memory; with many SuperNodes on one machine its lock loses messages "
        "(docs/reliability.md#load)",
    )
    p.add_argument(
        "--worker-per-node",
        action="store_true",
        help="a resident worker for each SuperNode (their messages handled in parallel, about "
        "0.5 GB more per node) in place of one shared by all; always so with --gpus",
    )
    p.set_defaults(func=cmd_deploy)


def _add_simulate(sub: Any) -> None:
    """`pollen simulate`'s arguments."""
    p = _command(sub, "simulate", help="the same run on Flower's simulation runtime")
    _add_run_options(p)
    p.add_argument("--parallel", type=int, default=2, help="clients trained at once")
    p.add_argument(
        "--nodes",
        type=int,
        metavar="K",
        help="simulated SuperNodes the clients are packed onto (each hosts a contiguous block "
        f"of client ids; one message per node and phase); default "
        f"{NODES_PER_PARALLEL_CLIENT} x --parallel or one per {CLIENTS_PER_NODE} clients up "
        f"to {MOST_NODES}, whichever is more, at most one per client",
    )
    p.add_argument(
        "--gpus-per-client",
        type=float,
        default=0.0,
        metavar="F",
        help="share of a GPU each client reserves in Ray (0.5: two clients per GPU); 0: the "
        "clients see no GPU and train on the CPU",
    )
    p.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="run the clients on an existing Ray cluster (its head's `ray start --head` "
        "address; RAY_ADDRESS in the environment does the same), one CPU per client, "
        "--parallel aside; default: a Ray instance of the run's own on this machine",
    )
    p.set_defaults(func=cmd_simulate)


def _add_run(sub: Any) -> None:
    """`pollen run`'s arguments."""
    p = _command(sub, "run", help="submit a run to a running SuperLink and follow it")
    _add_run_options(p)
    p.add_argument("--superlink", required=True, help="SuperLink HOST:PORT (its --port)")
    p.add_argument("--root-certificates", help="CA certificate when the SuperLink uses TLS")
    p.add_argument(
        "--signing-key",
        metavar="FILE",
        help="the operator's private key (signing.key): sign the app so SuperNodes run it",
    )
    p.add_argument(
        "--wait-superlink",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for the SuperLink to answer before submitting",
    )
    p.set_defaults(func=cmd_run)


def _add_server(sub: Any) -> None:
    """`pollen server`'s arguments."""
    p = _command(sub, "server", help="start a SuperLink for clients on other machines")
    p.add_argument(
        "--port", type=_port, default=9093, help="HTTP API (Control + Runtime): runs are submitted"
    )
    p.add_argument(
        "--api-host",
        default="127.0.0.1",
        help="interface of the HTTP API; loopback, so only this machine can submit runs",
    )
    p.add_argument(
        "--expose-api",
        action="store_true",
        help="bind the HTTP API to all interfaces: whoever reaches --port can then submit a run "
        "(run code in the ServerApp and on every client)",
    )
    p.add_argument("--fleet-port", type=_port, default=9092, help="Fleet API (gRPC) for SuperNodes")
    p.add_argument(
        "--fleet-host", default="0.0.0.0", help="interface of the Fleet API (all, by default)"
    )
    p.add_argument("--tls-dir", help="directory with ca.crt, server.pem, server.key")
    p.add_argument(
        "--insecure", action="store_true", help="no TLS: only on a network you trust (required "
        "when no --tls-dir is given)"
    )  # fmt: skip
    p.add_argument("--auth", action="store_true", help="accept only registered SuperNodes")
    p.add_argument(
        "--allow-list",
        metavar="DIR",
        help="with --auth: register the SuperNode public keys (*.pub) in DIR at start",
    )
    p.add_argument(
        "--isolation",
        choices=["subprocess", "process"],
        default="subprocess",
        help="process: the ServerApp runs in a separate `flower-superexec` (another container)",
    )
    p.add_argument(
        "--superexec-auth-secret-file",
        metavar="FILE",
        help="with --isolation process: the secret the ServerApp's SuperExec must prove it "
        "holds (scripts/generate-certs.sh writes superexec.secret)",
    )
    p.add_argument("--database", help="SQLite file keeping runs across SuperLink restarts")
    p.add_argument("--workdir", help="with --allow-list: where the flwr CLI keeps its files")
    p.add_argument(
        "--ready-file",
        metavar="FILE",
        help="written once the SuperLink answers and the allow-list is registered (a health check)",
    )
    p.set_defaults(func=cmd_server)


def _add_client(sub: Any) -> None:
    """`pollen client`'s arguments."""
    p = _command(sub, "client", help="start a SuperNode serving one partition")
    p.add_argument("--superlink", required=True, help="SuperLink fleet address HOST:PORT")
    p.add_argument("--partition-id", type=int, required=True)
    p.add_argument("--num-partitions", type=int, required=True)
    p.add_argument(
        "--state-dir",
        default="pollen-client-state",
        help="where this client's personal state is kept across restarts",
    )
    p.add_argument("--data-dir", help="directory with torchvision datasets")
    p.add_argument("--cache-dir", help="partition cache directory")
    p.add_argument(
        "--port", type=_port, help="local Runtime API port for its ClientApps (default: a free one)"
    )
    p.add_argument(
        "--max-wait-time",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="give up when the SuperLink cannot be reached for this long",
    )
    p.add_argument(
        "--wait-forever", action="store_true", help="never give up reconnecting to the SuperLink"
    )
    p.add_argument("--root-certificates", help="CA certificate when the SuperLink uses TLS")
    p.add_argument(
        "--insecure", action="store_true", help="no TLS: only on a network you trust (required "
        "when no --root-certificates is given)"
    )  # fmt: skip
    p.add_argument("--auth-key", help="private key registered with the SuperLink")
    p.add_argument(
        "--trusted-key",
        metavar="FILE",
        help="the operator's public key (signing.pub): only apps signed with its private half run",
    )
    p.add_argument(
        "--allow-any-app",
        action="store_true",
        help="run any app the SuperLink hands this node, signed or not",
    )
    p.add_argument(
        "--gpu",
        type=int,
        metavar="N",
        help="train on CUDA GPU N only (CUDA_VISIBLE_DEVICES=N); default: every GPU is visible "
        "and device=auto takes the first",
    )
    _add_attack_options(p, "this node")
    _add_worker_option(p, "the SuperNode")
    p.set_defaults(func=cmd_client)


def _add_report(sub: Any) -> None:
    """`pollen report`'s arguments."""
    p = _command(
        sub, "report", help="plots, CSV files and a Markdown summary of results directories"
    )
    p.add_argument(
        "dirs", nargs="+", help="results directories; runs that differ only in the seed are "
        "drawn as mean ± std"
    )  # fmt: skip
    p.add_argument("--out", help="where to write (default: the first directory's report/)")
    p.add_argument(
        "--format",
        default="png",
        metavar="LIST",
        help="plot formats, comma-separated: png, svg, pdf (e.g. png,svg,pdf)",
    )
    p.set_defaults(func=cmd_report)


def _add_experiment(sub: Any) -> None:
    """`pollen experiment`'s arguments."""
    p = _command(
        sub,
        "experiment",
        help="run a paper experiment file: methods x seeds, then a table of mean ± std",
    )
    p.add_argument("file", help="experiment file (see experiments/)")
    p.add_argument("--out", help="results directory (default: results/<experiment name>)")
    p.add_argument(
        "--table-only", action="store_true", help="only tabulate the runs already in --out"
    )
    p.add_argument("--seeds", help="run these seeds instead of the file's, e.g. 0 or 0,1")
    p.add_argument("--methods", help="run only these of the file's methods, e.g. fedem,fedavg")
    p.add_argument(
        "--gpus-per-client",
        type=float,
        metavar="F",
        help="simulation: each client reserves F of a GPU, passed to every `pollen simulate` "
        "(without it, simulated clients train on the CPU)",
    )
    p.add_argument("--parallel", type=int, metavar="N", help="simulation: clients trained at once")
    p.set_defaults(func=cmd_experiment)


def _add_data(sub: Any) -> None:
    """`pollen data` and its commands, download and summary."""
    data = _command(sub, "data", help="datasets: download, partition summary")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    _add_data_download(data_sub)
    _add_data_summary(data_sub)


def _add_data_download(data_sub: Any) -> None:
    """`pollen data download`'s arguments."""
    p = _command(data_sub, "download", help="fetch a torchvision dataset (needs internet)")
    p.add_argument("name")
    p.add_argument("--data-dir", required=True)
    p.set_defaults(func=cmd_data_download)


def _add_data_summary(data_sub: Any) -> None:
    """`pollen data summary`'s arguments."""
    p = _command(data_sub, "summary", help="per-client sizes and label counts of a partition")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--plot",
        nargs="?",
        const="partition.png",
        metavar="FILE",
        help="draw the label distribution per client (stacked bars with counts) to FILE "
        "(.png, .svg or .pdf; default partition.png)",
    )
    p.set_defaults(func=cmd_data_summary)


def _add_settings(sub: Any) -> None:
    """`pollen settings`'s argument."""
    p = _command(sub, "settings", help="list the run settings (all, or one algorithm's)")
    p.add_argument(
        "algorithm", nargs="?", help="only the settings this algorithm reads (and the common ones)"
    )
    p.set_defaults(func=cmd_settings)


def _add_listings(sub: Any) -> None:
    """`pollen algorithms` and `pollen datasets`, which take no arguments."""
    for name, func, text in (
        ("algorithms", cmd_algorithms, "list algorithms"),
        ("datasets", cmd_datasets, "list datasets"),
    ):
        p = _command(sub, name, help=text)
        p.set_defaults(func=func)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code: int = args.func(args)
        return code
    except (SettingsError, LaunchError, preflight.PreflightError) as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    except NothingToDo as exc:
        print(f"pollen: {exc}")
        return 0
    except BrokenPipeError:  # output piped into a reader that stopped (`| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file or directory the operator named that cannot be used
        where = f": {exc.filename}" if exc.filename else ""
        print(f"pollen: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pollen: interrupted; all processes stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
