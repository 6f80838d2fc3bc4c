"""`pollen server`: a SuperLink in the foreground for SuperNodes on other machines: its options
and this machine checked, what it lets others do said, and the SuperLink supervised until it
stops."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from pollen.tools import preflight
from pollen.tools.local_federation import TLS, LocalFederation, allow_list, tls_args_superlink
from pollen.tools.processes import LaunchError, bin_path


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
