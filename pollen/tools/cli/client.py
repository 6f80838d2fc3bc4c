"""`pollen client`: a SuperNode in the foreground serving this machine's partition with its data
and state; its options and this machine checked before it starts."""

from __future__ import annotations

import argparse
from pathlib import Path

from client import resident
from pollen.core.settings import Scalar
from pollen.tools import preflight
from pollen.tools.cli.checks import attack_node_config, host_port, warn
from pollen.tools.cli.gpu import check_gpus_present, gpu_environment
from pollen.tools.local_federation import load_certificate
from pollen.tools.node_service import app_runner_argv, runner_secret, serve_node, supernode_argv
from pollen.tools.processes import LaunchError, free_port


def cmd_client(args: argparse.Namespace) -> int:
    """Run a SuperNode in the foreground with this machine's partition, data and state."""
    host_port(args.superlink, "--superlink")
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
        check_gpus_present(f"--gpu {args.gpu}", args.gpu)
        gpu = gpu_environment([args.gpu], 0)
    if not args.root_certificates and not args.insecure:
        raise LaunchError(
            "no TLS material: give --root-certificates CA.crt (the SuperLink's CA), or "
            "--insecure to connect unencrypted on a network you trust"
        )
    trusted = _trusted_key(args)
    _check_client_machine(args)
    if args.insecure:
        warn(
            "--insecure: the model and this client's updates travel unencrypted; anyone on "
            "the network path can read and alter them"
        )
    if trusted is None:
        warn(
            "--allow-any-app: this machine runs the code of any app the SuperLink hands it, "
            "whoever submitted it"
        )
    if args.auth_key and not getattr(args, "peer_keys", None):
        warn(
            "--auth-key without --peer-keys: in secure aggregation this client takes the keys "
            "the server forwards as its neighbours' without checking them (a malicious server "
            "can substitute its own); give --peer-keys DIR, the registered nodes' *.pub"
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
    if getattr(args, "peer_keys", None):
        _check_peer_keys(Path(args.peer_keys))


def _check_peer_keys(path: Path) -> None:
    """`--peer-keys`: a directory of the registered SuperNodes' OpenSSH public keys."""
    from secagg.keys import NodeKeyError, read_peer_keys  # lazy: cryptography

    preflight.check_input_dir(path, "--peer-keys")
    try:
        read_peer_keys(path)
    except NodeKeyError as exc:
        raise LaunchError(f"--peer-keys: {exc}") from None


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
    node.update(attack_node_config(args))
    if args.auth_key:
        node["secagg-key"] = str(Path(args.auth_key).resolve())
    if getattr(args, "peer_keys", None):
        node["secagg-peers"] = str(Path(args.peer_keys).resolve())
    return supernode_argv(
        args.superlink,
        port if port is not None else (args.port or 9094),
        node,
        Path(args.root_certificates) if args.root_certificates else None,
        Path(args.auth_key) if args.auth_key else None,
        host="127.0.0.1",
        runner_secret=runner_secret,
    )
