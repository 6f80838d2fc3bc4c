"""`pollen`: run federations locally (deploy, simulate), join real ones (server, client, run),
and read results (report)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from pollen import settings as settings_mod
from pollen.launcher import (
    FLWR_ENV,
    TLS,
    Federation,
    LaunchError,
    allow_list,
    bin_path,
    follow,
    node_key,
    supernode_argv,
    tls_args_superlink,
)
from pollen.settings import Scalar, SettingsError


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


def resolve_run_settings(args: argparse.Namespace) -> dict[str, Scalar]:
    """Settings of a new or resumed run, every value checked before anything starts."""
    overrides: dict[str, Any] = settings_mod.parse_assignments(args.set)
    for flag, key in (
        ("algorithm", "algorithm"),
        ("dataset", "dataset"),
        ("clients", "num-clients"),
        ("rounds", "num-rounds"),
    ):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    base: dict[str, Any] = {}
    if args.resume:
        if not args.out:
            raise SettingsError("--resume needs --out DIR, the directory of the run to continue")
        saved = Path(args.out) / "config.json"
        if not saved.exists():
            raise SettingsError(f"--resume: {saved} not found (nothing to resume)")
        base = json.loads(saved.read_text())
        overrides["resume"] = True
    else:
        overrides.setdefault("resume", False)
    resolved = settings_mod.resolve(overrides, base)
    out = (
        Path(args.out)
        if args.out
        else Path("results")
        / (f"{resolved['algorithm']}-{resolved['dataset']}-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    if not args.resume and (out / "checkpoint").exists():
        raise SettingsError(
            f"{out} already holds a run; pass --resume to continue it or choose another --out"
        )
    resolved["out-dir"] = str(out.resolve())
    if not resolved["run-name"]:
        resolved["run-name"] = f"{out.name}-{int(time.time())}"
    if "min-available-clients" not in overrides and "min-available-clients" not in base:
        resolved["min-available-clients"] = resolved["num-clients"]
    _check_data(resolved)
    return resolved


def _check_data(resolved: dict[str, Scalar]) -> None:
    """Dataset and partition parameters are checked, and the partition cached, up front."""
    from federated_data import DataConfigError, load_client_data, validate_spec
    from pollen.dataspec import check_model_fits, data_spec, model_input
    from pollen.paths import cache_dir

    try:
        spec = data_spec(resolved)
        validate_spec(spec)
        check_model_fits(resolved)
        shape, classes = model_input(resolved)
        from models import build_model

        build_model(str(resolved["model"]), shape, classes)  # the model fits the data
        load_client_data(spec, 0, cache_dir(resolved))
    except (DataConfigError, ValueError) as exc:
        raise SettingsError(str(exc)) from None


# ---- commands ----------------------------------------------------------------------------
def cmd_deploy(args: argparse.Namespace) -> int:
    tls = TLS.from_dir(args.tls_dir) if args.tls_dir else None
    if args.auth and not tls:
        raise LaunchError("--auth (SuperNode authentication) needs TLS: give --tls-dir too")
    resolved = resolve_run_settings(args)
    out = Path(str(resolved["out-dir"]))
    n = int(resolved["num-clients"])
    keys = [node_key(args.tls_dir, i) for i in range(n)] if args.auth else []
    fed = Federation(out / "processes")
    security = ("with TLS" if tls else "insecure") + (" and node authentication" if keys else "")
    print(
        f"Pollen deploy: {resolved['algorithm']} on {resolved['dataset']}, {n} clients, "
        f"{resolved['num-rounds']} rounds, gRPC {security}; results in {out}",
        flush=True,
    )
    try:
        _, fleet_port = fed.start_superlink(tls=tls, auth=bool(keys))
        fed.register_nodes([key.with_suffix(".pub") for key in keys])
        for i in range(n):
            # the partition cache follows the run's cache-dir setting, which nodes also read
            fed.start_supernode(
                i, n, f"127.0.0.1:{fleet_port}", tls=tls, auth_key=keys[i] if keys else None,
                node_config={"state-dir": str(out / "client-state")},
            )  # fmt: skip
        fed.wait_nodes(n)
        print(f"SuperLink and {n} SuperNodes up (logs in {fed.workdir})", flush=True)
        return _run_and_report(fed, resolved, args.timeout)
    finally:
        fed.stop()


def cmd_simulate(args: argparse.Namespace) -> int:
    resolved = resolve_run_settings(args)
    out = Path(str(resolved["out-dir"]))
    n = int(resolved["num-clients"])
    fed = Federation(out / "processes")
    print(
        f"Pollen simulate: {resolved['algorithm']} on {resolved['dataset']}, {n} clients, "
        f"{resolved['num-rounds']} rounds; results in {out}",
        flush=True,
    )
    try:
        fed.start_superlink(simulation=True)
        cpus = max(1, (os.cpu_count() or 1) // max(1, args.parallel))
        fed.configure_simulation(n, cpus)
        return simulate_run(fed, resolved, args.timeout)
    finally:
        fed.stop()


RUNTIME_START_ATTEMPTS = 3
RUNTIME_START_FAILURE = "timed out during startup"
"""Ray's message when its node does not come up within its fixed 30 s (a loaded machine)."""


def simulate_run(
    fed: Federation, resolved: dict[str, Scalar], timeout: float, pause: float = 10.0
) -> int:
    """A run on the simulation runtime, submitted again (at most RUNTIME_START_ATTEMPTS times in
    all) when Ray's runtime did not start. That failure comes before any client has answered,
    so the next attempt starts from where this one did (the beginning or the checkpoint it
    resumed from)."""
    out = Path(str(resolved["out-dir"]))
    for attempt in range(1, RUNTIME_START_ATTEMPTS):
        code = _run_and_report(fed, resolved, timeout)
        log = out / "server.log"
        if code == 0 or RUNTIME_START_FAILURE not in log.read_text(errors="replace"):
            return code
        log.replace(out / f"server-attempt{attempt}.log")
        if not resolved["resume"]:  # what the failed attempt wrote; a resume keeps its history
            for name in ("events.jsonl", "summary.json"):
                (out / name).unlink(missing_ok=True)
        print(
            f"the simulation runtime did not start (attempt {attempt} of "
            f"{RUNTIME_START_ATTEMPTS}, log in server-attempt{attempt}.log); submitting again",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(pause)
    return _run_and_report(fed, resolved, timeout)


def cmd_run(args: argparse.Namespace) -> int:
    """Submit a run to a SuperLink that is already running (multi-machine deployment)."""
    resolved = resolve_run_settings(args)
    fed = Federation(Path(str(resolved["out-dir"])) / "processes")
    fed.write_connection(
        args.superlink, Path(args.root_certificates) if args.root_certificates else None
    )
    fed.wait_reachable(args.wait_superlink)
    return _run_and_report(fed, resolved, args.timeout)


def _run_and_report(fed: Federation, resolved: dict[str, Scalar], timeout: float) -> int:
    out = Path(str(resolved["out-dir"]))
    run_id = fed.submit(resolved)
    print(f"run {run_id} submitted", flush=True)
    try:
        status = follow(fed, run_id, out, timeout, num_rounds=int(resolved["num-rounds"]))
    except KeyboardInterrupt:
        fed.stop_run(run_id)
        raise
    log = fed.server_log(run_id)
    (out / "server.log").write_text(log)
    state = status.get("status", "unknown")
    if state != "finished:completed":
        print(f"run {run_id} {state}: {status.get('status-details', '')}", file=sys.stderr)
        tail = "\n".join(log.splitlines()[-20:])
        if tail:
            print(tail, file=sys.stderr)
        return 1
    summary_path = out / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
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
    tls = TLS.from_dir(args.tls_dir) if args.tls_dir else None
    if args.auth and not tls:
        raise LaunchError("--auth (SuperNode authentication) needs TLS: give --tls-dir too")
    if args.allow_list and not args.auth:
        raise LaunchError("--allow-list is for --auth: give both")
    argv = superlink_argv(args, tls)
    if not args.allow_list:
        return _exec(argv)
    return _serve_with_allow_list(argv, args, tls)


def superlink_argv(args: argparse.Namespace, tls: TLS | None) -> list[str]:
    """The `flower-superlink` command line `pollen server` runs."""
    argv = [
        "flower-superlink",
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--fleet-api-type",
        "grpc-rere",
        "--fleet-api-address",
        f"{args.host}:{args.fleet_port}",
        "--disable-runtime-dependency-installation",
        "--isolation",
        args.isolation,
        *tls_args_superlink(tls),
    ]
    if args.database:
        argv += ["--database", args.database]
    if args.auth:
        argv.append("--enable-supernode-auth")
    return argv


def _serve_with_allow_list(argv: list[str], args: argparse.Namespace, tls: TLS | None) -> int:
    """Run the SuperLink as a child, register the allow-list's keys once it answers, then
    stay in the foreground until it exits (Ctrl-C or SIGTERM stop it)."""
    keys = allow_list(args.allow_list)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="superlink-"))
    fed = Federation(workdir)
    proc = fed.spawn("superlink", [bin_path(argv[0]), *argv[1:]], console=True)
    try:
        local = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        fed.wait_health(f"https://{local}:{args.port}/health", proc, tls)
        fed.write_connection(f"{local}:{args.port}", tls.ca_cert if tls else None)
        fed.register_nodes(keys)
        print(f"allow-list: {len(keys)} SuperNode keys from {args.allow_list}", flush=True)
        return proc.popen.wait()
    finally:
        fed.stop()


def cmd_client(args: argparse.Namespace) -> int:
    """Run a SuperNode in the foreground with this machine's partition, data and state."""
    return _exec(supernode_argv_of(args))


def supernode_argv_of(args: argparse.Namespace) -> list[str]:
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
    return supernode_argv(
        args.superlink,
        args.port,
        node,
        Path(args.root_certificates) if args.root_certificates else None,
        Path(args.auth_key) if args.auth_key else None,
        host="127.0.0.1",
    )


def _exec(argv: list[str]) -> NoReturn:
    """Become the Flower daemon (signals reach it directly); it finds its helpers on PATH."""
    env = dict(os.environ, **FLWR_ENV)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    argv = [bin_path(argv[0]), *argv[1:]]
    print("exec:", " ".join(argv), flush=True)
    os.execve(argv[0], argv, env)


def cmd_report(args: argparse.Namespace) -> int:
    from pollen.report import ReportError, write_report

    try:
        out = write_report([Path(d) for d in args.dirs], Path(args.out) if args.out else None)
    except ReportError as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    print(f"report written to {out}")
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from pollen.experiment import Experiment, run, tabulate

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
    table = tabulate(exp, out) if args.table_only else run(exp, out)
    print((out / "results.md").read_text())
    return 0 if table["methods"] else 1


def cmd_data_download(args: argparse.Namespace) -> int:
    """Fetch a torchvision dataset into a data directory (needs internet)."""
    from federated_data import DataConfigError, load_dataset
    from federated_data.registry import dataset_param_names

    if dataset_param_names(args.name):
        print(f"{args.name} is generated on the clients from the run settings; nothing to download")
        return 0
    try:
        source = load_dataset(args.name, args.data_dir, download=True)
    except DataConfigError as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    test = len(source.test) if source.test is not None else 0
    print(f"{args.name}: {len(source.train)} training and {test} test examples in {args.data_dir}")
    return 0


def cmd_data_summary(args: argparse.Namespace) -> int:
    """Show how a run's settings split the data: sizes and labels per client."""
    from federated_data import DataConfigError, partition_summary
    from pollen.dataspec import data_spec
    from pollen.paths import cache_dir

    try:
        resolved = settings_mod.resolve(settings_mod.parse_assignments(args.set))
        summary = partition_summary(data_spec(resolved), cache_dir(resolved))
    except (SettingsError, DataConfigError) as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(summary, indent=1 if args.json else None)
        if args.json
        else _format_partition(summary)
    )
    return 0


def _format_partition(summary: dict[str, Any]) -> str:
    lines = []
    for client in summary.get("clients", []):
        labels = client.get("train_labels") or []
        held = [str(i) for i, n in enumerate(labels) if n]
        lines.append(
            f"client {client.get('client_id', '?'):>3}: "
            + ", ".join(f"{k}={client[k]}" for k in ("train", "val", "test") if k in client)
            + (f"  labels {' '.join(held)}" if held else "")
        )
    return "\n".join(lines) if lines else json.dumps(summary)


def cmd_settings(args: argparse.Namespace) -> int:
    for key, s in settings_mod.all_settings().items():
        extra = f" one of: {', '.join(s.choices)}" if s.choices else ""
        print(f"{key:24s} {s.default!r:>12}  {s.help}{extra}")
    return 0


def cmd_algorithms(args: argparse.Namespace) -> int:
    from pollen.registry import ALGORITHMS

    for name, spec in sorted(ALGORITHMS.items()):
        print(f"{name:12s} {spec.description}")
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    from federated_data.catalog import CATALOG

    for name, info in CATALOG.items():
        print(f"{name:14s} input {info.input_shape}, {info.num_classes} classes")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pollen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("deploy", help="SuperLink + N SuperNodes as processes on loopback (gRPC)")
    _add_run_options(p)
    p.add_argument("--tls-dir", help="directory with ca.crt, server.pem, server.key")
    p.add_argument(
        "--auth",
        action="store_true",
        help="SuperNode authentication: node i signs with <tls-dir>/supernodes/node-i.key, "
        "the SuperLink accepts only the registered keys",
    )
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("simulate", help="the same run on Flower's simulation runtime")
    _add_run_options(p)
    p.add_argument("--parallel", type=int, default=2, help="clients trained at once")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("run", help="submit a run to a running SuperLink and follow it")
    _add_run_options(p)
    p.add_argument("--superlink", required=True, help="SuperLink HOST:PORT (its --port)")
    p.add_argument("--root-certificates", help="CA certificate when the SuperLink uses TLS")
    p.add_argument(
        "--wait-superlink",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for the SuperLink to answer before submitting",
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("server", help="start a SuperLink for clients on other machines")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=9093, help="control/runtime API (HTTP)")
    p.add_argument("--fleet-port", type=int, default=9092, help="SuperNode API (gRPC)")
    p.add_argument("--tls-dir", help="directory with ca.crt, server.pem, server.key")
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
    p.add_argument("--database", help="SQLite file keeping runs across SuperLink restarts")
    p.add_argument("--workdir", help="with --allow-list: where the flwr CLI keeps its files")
    p.set_defaults(func=cmd_server)

    p = sub.add_parser("client", help="start a SuperNode serving one partition")
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
    p.add_argument("--port", type=int, default=9094, help="local ClientApp API port")
    p.add_argument("--root-certificates", help="CA certificate when the SuperLink uses TLS")
    p.add_argument("--auth-key", help="private key registered with the SuperLink")
    p.set_defaults(func=cmd_client)

    p = sub.add_parser("report", help="plots and a Markdown summary of results directories")
    p.add_argument("dirs", nargs="+")
    p.add_argument("--out", help="where to write (default: the first directory's report/)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
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
    p.set_defaults(func=cmd_experiment)

    data = sub.add_parser("data", help="datasets: download, partition summary")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("download", help="fetch a torchvision dataset (needs internet)")
    p.add_argument("name")
    p.add_argument("--data-dir", required=True)
    p.set_defaults(func=cmd_data_download)
    p = data_sub.add_parser("summary", help="per-client sizes and labels of a partition")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_data_summary)

    for name, func, text in (
        ("settings", cmd_settings, "list every run setting"),
        ("algorithms", cmd_algorithms, "list algorithms"),
        ("datasets", cmd_datasets, "list datasets"),
    ):
        p = sub.add_parser(name, help=text)
        p.set_defaults(func=func)
    return parser


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code: int = args.func(args)
        return code
    except (SettingsError, LaunchError) as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pollen: interrupted; all processes stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
