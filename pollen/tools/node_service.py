"""Serving one SuperNode in the foreground (`pollen client`): its command line, its app
runner's, its resident worker, and one line saying why it exited."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from client import resident
from pollen.core.settings import Scalar, toml_value
from pollen.tools.diagnosis import ANSI, ConsoleCopy, known_cause
from pollen.tools.processes import FLWR_ENV, PROJECT_DIR, bin_path, die_with_parent


def supernode_argv(
    fleet: str,
    port: int,
    node_config: Mapping[str, Scalar],
    ca_cert: Path | None,
    auth_key: Path | None,
    host: str = "127.0.0.1",
    runner_secret: Path | None = None,
) -> list[str]:
    """`flower-supernode`'s command line. With `runner_secret` the SuperNode starts no app
    process itself (`--isolation process`): Pollen's app runner (`app_runner_argv`), proving
    it holds that secret, runs only signed apps."""
    argv = [
        bin_path("flower-supernode"),
        "--grpc-rere",
        "--superlink",
        fleet,
        "--host",
        host,
        "--port",
        str(port),
        "--node-config",
        " ".join(f"{k}={toml_value(v)}" for k, v in node_config.items()),
    ]
    argv += ["--insecure"] if ca_cert is None else ["--root-certificates", str(ca_cert)]
    if auth_key is not None:
        argv += ["--auth-supernode-private-key", str(auth_key)]
    if runner_secret is not None:
        argv += ["--isolation", "process", "--superexec-auth-secret-file", str(runner_secret)]
    return argv


def runner_secret(directory: Path) -> Path:
    """A fresh random secret (mode 600) shared by one SuperNode and its app runner only."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "app-runner.secret"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(os.urandom(32).hex().encode())
    return path


def app_runner_argv(
    runtime_api: str, trusted_key: Path, supernode_pid: int, secret: Path
) -> list[str]:
    """Pollen's app runner for the SuperNode whose Runtime API is `runtime_api`: Flower's
    SuperExec that launches ClientApps only from bundles signed by `trusted_key`'s owner; it
    exits with the SuperNode."""
    return [
        sys.executable, "-m", "pollen.tools.app_runner", "--trusted-key", str(trusted_key), "--",
        "--runtime-api-address", runtime_api, "--insecure", "--parent-pid", str(supernode_pid),
        "--superexec-auth-secret-file", str(secret),
    ]  # fmt: skip


NODE_EXIT_UNKNOWN = "the SuperNode exited; its log is above"


def explain_node_exit(lines: Sequence[str], superlink: str, waited: float | None) -> str:
    """One line saying why a SuperNode that could not stay connected exited, from its log."""
    known = known_cause(lines)
    if known is not None:
        return known
    text = ANSI.sub("", "\n".join(lines))
    if "SuperNode authentication is enabled" in text:
        return (
            f"the SuperLink at {superlink} accepts only registered SuperNodes: give --auth-key "
            "with a key on its allow-list"
        )
    if "Failed to activate SuperNode" in text:
        return (
            f"the SuperLink at {superlink} refused this SuperNode: its key is not on the "
            "allow-list, or a node with this key crashed less than about a minute ago and is "
            "still registered (start it again after that)"
        )
    if "Giving up reconnection" in text or "could not establish a connection" in text:
        detail = ""
        for line in text.splitlines():
            if "last error:" in line:
                detail = f" (last error: {line.split('last error:', 1)[1].strip()})"
        within = f" within {waited:g} s" if waited is not None else ""
        return (
            f"could not connect to the SuperLink's Fleet API at {superlink}{within}{detail}; "
            "likely causes: nothing listening there (wrong host or port, SuperLink not "
            "started, a firewall), or a TLS mismatch (--insecure against a TLS SuperLink, "
            "--root-certificates not its CA, or an address its certificate does not name)"
        )
    return NODE_EXIT_UNKNOWN


def serve_node(
    argv: Sequence[str],
    runner: Callable[[int], list[str]] | None,
    superlink: str,
    waited: float | None,
    env_extra: Mapping[str, str] | None = None,
    worker_socket: Path | None = None,
) -> int:
    """Run a SuperNode (and its app runner) in the foreground until it exits or this process
    is asked to stop, which it passes on as exactly one SIGTERM to the SuperNode (a second
    signal to its process group could leave it registered). The SuperNode's log goes to this
    process's output; if it exits on its own with an error, one line says why. `env_extra`:
    variables for the SuperNode and what it starts (`pollen client --gpu`:
    CUDA_VISIBLE_DEVICES). `worker_socket`: start the node's resident worker there first
    (client.worker), which its ClientApps relay to."""
    env = dict(os.environ, **FLWR_ENV, **(env_extra or {}))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    argv = [bin_path(argv[0]), *argv[1:]]
    worker, owner = None, -1
    if worker_socket is not None:
        owner = resident.hold_owner_lock(worker_socket)  # released when the node ends
        env[resident.SOCKET_ENV] = str(worker_socket)
        worker = subprocess.Popen(
            resident.worker_argv(worker_socket), env=resident.worker_env(env, PROJECT_DIR),
            stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip
    print("starting:", " ".join(argv), flush=True)
    node = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent,
    )  # fmt: skip
    helper = None
    if runner is not None:
        helper = subprocess.Popen(
            runner(node.pid), env=env, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            with contextlib.suppress(ProcessLookupError):
                node.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    console = ConsoleCopy(node)  # a traceback is held back until it is known to be fatal
    code = node.wait()
    # what the SuperNode started (its SuperExec, ClientApps) may outlive it and hold its output
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(node.pid, signal.SIGKILL)
    held = console.finish()
    for child in (helper, worker):
        if child is None:
            continue
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    if worker_socket is not None:
        resident.release_owner_lock(worker_socket, owner)
    if stopping:
        return 0
    if code != 0:
        reason = explain_node_exit(console.tail, superlink, waited)
        if reason == NODE_EXIT_UNKNOWN:
            console.show(held)
        print(f"pollen: error: {reason}", file=sys.stderr)
    return code
