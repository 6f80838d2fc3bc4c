"""`pollen deploy`: a SuperLink and one SuperNode per client as processes on this machine, talking
gRPC over loopback, and the run on them."""

from __future__ import annotations

import argparse
from pathlib import Path

from pollen.core import rundir
from pollen.core.settings import RunSettings, Scalar
from pollen.tools.cli.checks import attack_node_config, warn
from pollen.tools.cli.gpu import deploy_gpus, gpu_environment
from pollen.tools.cli.outcome import run_and_report
from pollen.tools.cli.resolve import Watch, one_client_per_node, resolve_run_settings
from pollen.tools.local_federation import TLS, LocalFederation, node_key
from pollen.tools.processes import LaunchError


def cmd_deploy(args: argparse.Namespace) -> int:
    tls = TLS.from_dir(args.tls_dir) if args.tls_dir else None
    if args.auth and not tls:
        raise LaunchError("--auth (SuperNode authentication) needs TLS: give --tls-dir too")
    # a SuperNode whose hello is lost for good (or that never starts) does not stop the run:
    # `--set min-available-clients=N` requires N (docs/reliability.md#load)
    resolved = resolve_run_settings(args, require_all=False)
    run = RunSettings.of(resolved)
    one_client_per_node(run)
    out, n = Path(run.out_dir), run.num_clients
    gpus = deploy_gpus(args.gpus, run.device)
    attack = attack_node_config(args)
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
                             **(_signing(keys[i]) if keys else {}),
                             **(attack if i in attackers else {})},
                env_extra=gpu_environment(gpus, i),
            )  # fmt: skip
        if attackers:
            warn(f"SuperNodes {attackers} attack the run ({attack['attack']}, --attack)")
        print(f"waiting for {n} SuperNodes to connect to the SuperLink", flush=True)
        fed.wait_nodes(n)
        print(f"SuperLink and {n} SuperNodes up (logs in {fed.workdir})", flush=True)
        if gpus:
            spread = ", ".join(f"{i}: GPU {gpus[i % len(gpus)]}" for i in range(n))
            print(f"SuperNodes on GPUs (CUDA_VISIBLE_DEVICES) {spread}", flush=True)
        return run_and_report(fed, resolved, args.timeout, Watch.of(args))
    finally:
        fed.stop()


def _attack_nodes(args: argparse.Namespace, n: int) -> list[int]:
    """The SuperNodes `--attack` applies to: the last --attack-nodes of the n."""
    k = args.attack_nodes
    if not 1 <= k < n:
        raise LaunchError(f"--attack-nodes must be between 1 and {n - 1} (the clients), not {k}")
    return list(range(n - k, n))


def _signing(key: Path) -> dict[str, Scalar]:
    """The node config with which a node's client signs its secure-aggregation keys with the
    node's key and takes only keys signed by the registered nodes (docs/security.md)."""
    return {"secagg-key": str(key.resolve()), "secagg-peers": str(key.resolve().parent)}
