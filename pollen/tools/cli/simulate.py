"""`pollen simulate`: the run on Flower's simulation runtime (Ray), its clients packed onto
simulated SuperNodes, and submitted again when Ray's runtime does not start."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from pollen.core import rundir
from pollen.core import settings as settings_mod
from pollen.core.settings import RunSettings, Scalar, SettingsError
from pollen.tools.cli.gpu import ray_cluster, simulation_gpus
from pollen.tools.cli.outcome import run_and_report
from pollen.tools.cli.resolve import Watch, model_bytes, resolve_run_settings
from pollen.tools.local_federation import LocalFederation


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.parallel < 1:
        raise SettingsError(
            f"--parallel (clients trained at once) must be 1 or more, not {args.parallel}"
        )
    ray_address = ray_cluster(args.ray_address)
    # on an existing Ray cluster the clients train on its nodes: this machine's devices do not
    # count (the cluster's nodes declare their GPUs to Ray)
    resolved = resolve_run_settings(args, local=ray_address is None)
    nodes = _simulation_nodes(args, resolved, ray_address is not None)
    resolved["simulation-nodes"] = nodes
    given = settings_mod.parse_assignments(args.set)
    if not args.resume and "poll-interval" not in given:
        resolved["poll-interval"] = SIMULATION_POLL_INTERVAL
    if not args.resume and "heterogeneity.clock" not in given:
        # simulated devices on the virtual clock: a run ends the same on any machine
        resolved["heterogeneity.clock"] = "virtual"
    run = RunSettings.of(resolved)
    out, n = Path(run.out_dir), run.num_clients
    num_gpus = simulation_gpus(args.gpus_per_client, run.device, ray_address is not None)
    fed = LocalFederation(out / rundir.PROCESSES)
    # the SuperLink's environment reaches the simulation process, whose ray.init() reads it;
    # "local": a Ray instance of its own, never a cluster `ray start` left on this machine
    fed.env["RAY_ADDRESS"] = ray_address or "local"
    for name, value in {**SIMULATION_MALLOC, **SIMULATION_RAY}.items():
        fed.env.setdefault(name, value)
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


SIMULATION_POLL_INTERVAL = 0.05
"""`pollen simulate`'s longest wait between two polls for replies (setting poll-interval, unless
given; a resumed run keeps its own): the server reads them from the simulation's in-memory
state, where a poll costs little, while a wait that grows with the time waited (up to a quarter
of it) picks a phase's last reply up late and folds its replies in bursts (FedAvg, 1,000
clients, `--parallel 2`: 2.78 → 2.60 s and 2.35 → 1.95 s a round,
docs/performance.md#settings-that-change-these-figures)."""

SIMULATION_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": str(64 * 2**20),
    "MALLOC_TRIM_THRESHOLD_": str(2**30),
}
"""glibc's allocator in the simulation's processes (the user's own values win): every client's
reply is a model-sized buffer made, copied and freed in turn, each time in fresh pages (mapped
for it, or given back with the heap's top) unless the allocator reuses the memory it has
(docs/performance.md#settings-that-change-these-figures). The peak memory stays that of the
largest round; the processes keep it between rounds."""

SIMULATION_RAY = {"RAY_free_objects_period_milliseconds": "100"}
"""Ray's settings in the simulation's own Ray instance (the user's own values win). Ray's
raylet deletes the objects no one refers to any more in batches, once a second by default, so
a second's worth of replies stays in the shared-memory object store, whose pages the workers
and the simulation process all map (a packed node's reply carries every client's model: 51 MB
for 64 MNIST clients). FedAvg on mnist-5k, 1,000 clients, `--parallel 2`: the store's pages
530 MB in each of those three processes with the default, 145 MB with a batch every 0.1 s,
rounds no slower (docs/performance.md#settings-that-change-these-figures)."""

NODES_PER_PARALLEL_CLIENT = 4
"""`pollen simulate`'s default packing: simulated SuperNodes per client trained at once, so that
a phase's clients spread evenly over Ray's workers..."""

CLIENTS_PER_NODE = 16
"""... and at least this many clients per node, more for a small model (NODE_MODEL_BYTES), up
to MOST_CLIENTS_PER_NODE: a node's message (its clients' instructions and replies, which its
ClientApp holds at once) stays small as clients grow..."""

NODE_MODEL_BYTES = 64 * 2**20
"""... holding at most this much of the run's model (its weights times the node's clients) above
CLIENTS_PER_NODE clients..."""

MOST_CLIENTS_PER_NODE = 64
"""... and at most this many clients, so that a phase's last messages (which the server checks
and folds after the workers are done) stay short..."""

MOST_NODES = 64
"""... up to this many nodes: Flower's simulation engine looks for each node's messages by
scanning all of them (every 0.1 s), a cost that grows with the square of the nodes (on 2 cores,
FedAvg on mnist-5k at 1,000 clients: 4.2 s a round on 63 nodes, 2.5 s on 16,
docs/performance.md#settings-that-change-these-figures)."""


def clients_per_node(model_bytes: int) -> int:
    """The default packing's clients per node for a run whose model weighs `model_bytes`."""
    fit = NODE_MODEL_BYTES // max(1, model_bytes)
    return max(CLIENTS_PER_NODE, min(MOST_CLIENTS_PER_NODE, fit))


NODES_ON_A_CLUSTER = 256
"""The default packing's least simulated SuperNodes on a Ray cluster, whose size is its own."""


def _simulation_nodes(args: argparse.Namespace, resolved: dict[str, Scalar], cluster: bool) -> int:
    """The simulated SuperNodes the run's clients are packed onto (README, Simulation at scale):
    --nodes, else a simulation-nodes setting given, else NODES_PER_PARALLEL_CLIENT per
    --parallel (on a cluster NODES_ON_A_CLUSTER) or one per `clients_per_node` clients up to
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
        per_node = clients_per_node(model_bytes(resolved))
        nodes = min(n, max(least, min(math.ceil(n / per_node), MOST_NODES)))
    if not 1 <= nodes <= n:
        raise SettingsError(
            f"--nodes {nodes}: the simulated SuperNodes must number from 1 to the run's {n} "
            "clients (each hosts at least one)"
        )
    return nodes


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
        code = run_and_report(fed, resolved, timeout, watch)
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
    return run_and_report(fed, resolved, timeout, watch)
