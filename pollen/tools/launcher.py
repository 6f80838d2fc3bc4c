"""Starts Flower's processes, submits runs through the `flwr` CLI and follows them.

Nothing here imports training code: the launcher only runs `flower-superlink`,
`flower-supernode` and `flwr`, each in its own process group so that teardown (on success,
failure or Ctrl-C) leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from client import resident
from pollen.core import rundir
from pollen.core.contracts.launcher import LAUNCHER_PID
from pollen.core.settings import Scalar, toml_value
from pollen.tools.diagnosis import ANSI, ConsoleCopy, known_cause, no_space
from pollen.tools.preflight import free_mb
from pollen.tools.progress import NODE_RESTART_LIMIT, Progress, Sink

PROJECT_DIR = Path(__file__).resolve().parents[2]
TASK_POLL_INTERVAL = "0.1"
"""Seconds between a SuperExec's polls for a new task (Flower's default: 1 s). Every message
waits for the next poll of its node's SuperExec, and every run for the SuperLink's; at 0.1 s
the polls cost little CPU (docs/performance.md). An operator's own
FLWR_SUPEREXEC_TASK_POLL_INTERVAL is kept."""

FLWR_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": os.environ.get(
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL", TASK_POLL_INTERVAL
    ),
}


FLWR_TIMED_OUT = 124
"""Exit code `Federation.flwr` gives a CLI call that did not answer in time (as timeout(1))."""


class LaunchError(RuntimeError):
    """A process did not start, a run could not be submitted, or a run failed."""


class DiskFull(LaunchError):
    """A process of the federation logged a full disk: the run cannot go on."""


START_TIMEOUT = 300.0
"""Seconds a submitted run's ServerApp may take to write its first event before the run is
stopped (`--start-timeout`): on a loaded 2-core machine it starts in well under a minute; a
ServerApp that cannot start (no SuperExec serving the SuperLink, a full disk, a crashed child)
never does."""


def _die_with_parent() -> None:
    """Runs in each child before exec: on Linux the child is killed if the launcher dies (even
    by SIGKILL), so no SuperLink or SuperNode outlives it. SIGKILL, not SIGTERM: a SuperNode's
    graceful shutdown keeps retrying to deregister from a SuperLink that died with the launcher;
    the processes they started exit by watching their parent's pid."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def app_dir() -> Path:
    if not (PROJECT_DIR / "pyproject.toml").exists():
        raise LaunchError(
            f"no pyproject.toml in {PROJECT_DIR}: run Pollen from its source checkout "
            "(pip install -e .), which is also what Flower bundles as the app"
        )
    return PROJECT_DIR


def bin_path(name: str) -> str:
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise LaunchError(f"'{name}' not found; is flwr installed in this environment?")
    return found


@dataclass
class TLS:
    """Certificates for the SuperLink (server side) and the CA the nodes trust."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    @classmethod
    def from_dir(cls, directory: str | Path) -> TLS:
        d = Path(directory).resolve()
        tls = cls(d / "ca.crt", d / "server.pem", d / "server.key")
        for path in (tls.ca_cert, tls.server_cert, tls.server_key):
            if not path.is_file():
                raise LaunchError(
                    f"TLS file {path} not found (expected ca.crt, server.pem, "
                    "server.key in the certificate directory)"
                )
        tls.check()
        return tls

    def check(self) -> None:
        """The files parse, the key is the certificate's, the CA signed the certificate and it
        is in its validity period: LaunchError naming the problem otherwise."""
        from cryptography.exceptions import InvalidSignature  # lazy: cryptography
        from cryptography.hazmat.primitives import serialization  # lazy: cryptography

        ca = load_certificate(self.ca_cert)
        cert = load_certificate(self.server_cert)
        try:
            key = serialization.load_pem_private_key(self.server_key.read_bytes(), password=None)
        except (ValueError, TypeError, OSError) as exc:
            raise LaunchError(f"{self.server_key} is not a PEM private key ({exc})") from None

        def raw(public: Any) -> bytes:
            return bytes(
                public.public_bytes(
                    serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )

        if raw(key.public_key()) != raw(cert.public_key()):
            raise LaunchError(f"{self.server_key} is not the key of {self.server_cert}")
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            raise LaunchError(f"{self.server_cert} is not signed by {self.ca_cert}") from None
        now = time.time()
        if cert.not_valid_after_utc.timestamp() < now:
            raise LaunchError(f"{self.server_cert} expired on {cert.not_valid_after_utc:%Y-%m-%d}")
        if cert.not_valid_before_utc.timestamp() > now + 300:
            raise LaunchError(
                f"{self.server_cert} is not valid before {cert.not_valid_before_utc:%Y-%m-%d}"
            )


def load_certificate(path: Path) -> Any:
    """A PEM certificate (a CA's or a server's), or LaunchError naming the file."""
    from cryptography import x509  # lazy: cryptography

    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as exc:
        raise LaunchError(f"certificate {path} cannot be read: {exc.strerror}") from None
    except ValueError as exc:
        raise LaunchError(f"{path} is not a PEM certificate ({exc})") from None


def node_key(tls_dir: str | Path, index: int) -> Path:
    """SuperNode `index`'s private key, as scripts/generate-certs.sh --nodes lays them out."""
    key = Path(tls_dir).resolve() / "supernodes" / f"node-{index}.key"
    if not key.is_file() or not key.with_suffix(".pub").is_file():
        raise LaunchError(
            f"SuperNode key {key} (and its .pub) not found: create the keys with "
            f"scripts/generate-certs.sh {tls_dir} --nodes N"
        )
    return key


def allow_list(directory: str | Path) -> list[Path]:
    """The public keys (*.pub) of the SuperNodes a SuperLink accepts."""
    keys = sorted(Path(directory).resolve().glob("*.pub"))
    if not keys:
        raise LaunchError(f"no SuperNode public keys (*.pub) in {directory}")
    return keys


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    console: ConsoleCopy | None = None
    """The process's output goes to this process's (`Federation.spawn(console=True)`)."""

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def failure(self) -> LaunchError:
        """The error to raise for the process's exit: DiskFull when the disk its log is on is
        full (the process could not write, and often not even log why), else LaunchError with
        `exit_reason`."""
        code = self.popen.returncode
        where = self.log_path.parent
        if free_mb(where) < 1:
            return DiskFull(
                f"no space left on device in {where} ({free_mb(where):.1f} MB free): "
                f"{self.name} exited (code {code})"
            )
        return LaunchError(self.exit_reason())

    def exit_reason(self) -> str:
        """Why the process exited, for `pollen: error:`: one line when its output shows a
        cause the operator can fix (pollen.tools.diagnosis), else its exit code and its last lines
        (on the console, the traceback held back is shown first)."""
        code = self.popen.returncode
        if self.console is not None:
            held = self.console.finish()
            cause = known_cause(self.console.tail)
            if cause is not None:
                return cause
            self.console.show(held)
            return f"{self.name} exited (code {code}); its output is above"
        tail = self.tail(200)
        cause = known_cause([tail])
        if cause is not None:
            return f"{self.name}: {cause} (its log: {self.log_path})"
        return f"{self.name} exited (code {code}):\n{self.tail()}"


@dataclass
class Node:
    """A SuperNode this federation started (with its app runner), and how to start it again."""

    partition_id: int
    launch: Callable[[], list[Proc]]
    procs: list[Proc]
    restarts: int = 0
    died_at: float | None = None
    exit_code: int | None = None


NODE_RESTART_BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""Seconds before each restart; the last repeats. An authenticated SuperNode restarted within
about a minute of its crash is refused (its old session is still online), so the attempts span
more than two minutes in all."""


@dataclass
class Federation:
    """A set of local Flower processes plus a private FLWR_HOME to talk to them."""

    workdir: Path
    procs: list[Proc] = field(default_factory=list)
    connection: str = "pollen"
    signing_key: Path | None = None
    """The operator's private key: every app submitted is signed with it (pollen.tools.signing)."""
    trusted_key: Path | None = None
    """A public key: SuperNodes started here run only apps signed by its private half."""
    restart_nodes: bool = False
    """Restart a SuperNode that dies (same partition, state and key) instead of failing."""
    events: Path | None = None
    """The run's events.jsonl, where node restarts are recorded beside the server's events."""
    started_nodes: dict[int, Node] = field(default_factory=dict)
    restart_log: list[dict[str, Any]] = field(default_factory=list)
    superlink_started: bool = False
    """This federation started a SuperLink before (its database is then kept on a restart)."""
    resident_workers: bool = True
    """Start a resident worker beside every SuperNode (client.worker; its ClientApps relay)."""
    workers: list[Proc] = field(default_factory=list)
    """The workers started with the nodes: not part of a node, a worker that dies is started
    again by the node's next message (client.relay)."""
    shared_worker: bool = False
    """One resident worker for all the SuperNodes started here, in place of one each: torch and
    the interpreter once per machine (about 0.5 GB less per node), the nodes' messages answered
    one after another (on a machine with few cores the nodes' training competes for them
    anyway). Every node's ClientApps relay to it; it keeps every node's partition."""
    superlink_database: bool | Path = True
    """The SuperLink keeps its state in an SQLite file (`--database`; True: superlink.db in the
    work directory, or this path), so that a SuperLink this federation restarts keeps its runs
    and node ids. False: Flower's in-memory state, which has no database lock for concurrent
    SuperNodes to run into (docs/reliability.md#load)."""
    _shared_socket: Path | None = None
    _owner_locks: list[tuple[Path, int]] = field(default_factory=list)
    _log_read: dict[Path, tuple[int, bytes]] = field(default_factory=dict)
    """How far `disk_full` has read each process's log, and the end of what it read."""

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home = self.workdir / "flwr-home"
        self.home.mkdir(exist_ok=True)
        self.env = dict(os.environ, FLWR_HOME=str(self.home), **FLWR_ENV)
        self.env[LAUNCHER_PID] = str(os.getpid())
        self.env["PYTHONUNBUFFERED"] = "1"
        # Flower's daemons start `flower-superexec` and app processes by name: same environment.
        bindir = str(Path(sys.executable).parent)
        self.env["PATH"] = os.pathsep.join([bindir, self.env.get("PATH", "")])

    def spread_task_polls(self, nodes: int) -> None:
        """Many SuperNodes on one machine: their SuperExecs poll for tasks every
        TASK_POLL_INTERVAL x (nodes per core) seconds, not every TASK_POLL_INTERVAL. Each poll
        is an HTTP request its SuperNode answers; 17 SuperExecs at 0.1 s kept 16 SuperNodes at
        about 4 % of a core each while idle (2 cores), which slowed the ClientApp processes
        past Flower's 30 s to start a task. An operator's own
        FLWR_SUPEREXEC_TASK_POLL_INTERVAL is kept."""
        if "FLWR_SUPEREXEC_TASK_POLL_INTERVAL" in os.environ:
            return
        per_core = nodes / max(1, os.cpu_count() or 1)
        interval = float(TASK_POLL_INTERVAL) * max(1.0, per_core)
        self.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = f"{interval:g}"

    def sign_apps_with_new_key(self) -> None:
        """A key pair for this federation alone (`pollen deploy`): its submissions are signed
        with it and its SuperNodes trust only it."""
        from pollen.tools.signing import generate_key  # lazy: cryptography

        self.signing_key = self.workdir / "operator-signing.key"
        generate_key(self.signing_key)
        self.trusted_key = self.signing_key.with_suffix(".pub")

    # ---- processes -----------------------------------------------------------------------
    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        console: bool = False,
        track: bool = True,
    ) -> Proc:
        """Start `argv` logging to `<workdir>/<name>.log` (to this process's output if
        `console`); `track`: it must stay alive (`check_alive`)."""
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "ab") as log:
            self._log_read[log_path] = (log.tell(), b"")  # what was there before is not news
            popen = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE if console else log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env or self.env),
                start_new_session=True,
                cwd=self.workdir,
                preexec_fn=_die_with_parent,
            )
        proc = Proc(name, popen, log_path, ConsoleCopy(popen) if console else None)
        if track:
            self.procs.append(proc)
        return proc

    def start_superlink(
        self,
        *,
        simulation: bool = False,
        tls: TLS | None = None,
        auth: bool = False,
        host: str = "127.0.0.1",
    ) -> tuple[int, int]:
        http_port, fleet_port = free_port(), free_port()
        if not self.superlink_started:
            # a new database: node ids of an earlier command's SuperLink here (before a
            # resume) are gone; a SuperLink restarted by this federation keeps its database,
            # so registered SuperNodes keep their node ids
            for stale in self.workdir.glob("superlink.db*"):
                stale.unlink()
        self.superlink_started = True
        argv = [
            bin_path("flower-superlink"),
            "--host",
            host,
            "--port",
            str(http_port),
            "--disable-runtime-dependency-installation",
        ]
        if self.superlink_database is True:
            argv += ["--database", str(self.workdir / "superlink.db")]
        elif self.superlink_database:
            argv += ["--database", str(self.superlink_database)]
        if simulation:
            argv.append("--simulation")
        else:
            argv += ["--fleet-api-type", "grpc-rere", "--fleet-api-address", f"{host}:{fleet_port}"]
        argv += tls_args_superlink(tls)
        if auth:
            argv.append("--enable-supernode-auth")
        proc = self.spawn("superlink", argv)
        scheme = "https" if tls else "http"
        self.wait_health(f"{scheme}://{host}:{http_port}/health", proc, tls)
        self.write_connection(f"{host}:{http_port}", tls.ca_cert if tls else None)
        return http_port, fleet_port

    def register_nodes(self, public_keys: Sequence[Path], record: Path | None = None) -> int:
        """Put SuperNode public keys on the SuperLink's allow-list (`flwr supernode register`);
        returns how many were registered now. `record` (beside the SuperLink's database) lists
        the keys this database already holds, which are not registered again: Flower logs an
        ERROR for every key registered twice. A key the SuperLink knows anyway is fine."""
        known = _registered_keys(record)
        added = 0
        for key in public_keys:
            digest = _key_digest(key)
            if digest in known:
                continue
            out = self.flwr("supernode", "register", str(key), self.connection, "--format", "json")
            try:
                reply = json.loads(out.stdout)
            except json.JSONDecodeError:
                reply = {}
            if not reply.get("success") and "already in use" not in str(reply):
                raise LaunchError(f"could not register {key}:\n{out.stdout}{out.stderr}")
            added += bool(reply.get("success"))
            known.add(digest)
            if record is not None:
                _write_registered_keys(record, known)
        return added

    def start_supernode(
        self,
        partition_id: int,
        num_partitions: int,
        fleet: str,
        *,
        tls: TLS | None = None,
        auth_key: Path | None = None,
        node_config: Mapping[str, Scalar] | None = None,
        env_extra: Mapping[str, str] | None = None,
    ) -> Proc:
        config: dict[str, Scalar] = {"partition-id": partition_id, "num-partitions": num_partitions}
        config.update(node_config or {})
        home = self.workdir / f"node-{partition_id}"
        # env_extra: this node's own variables, e.g. CUDA_VISIBLE_DEVICES (`pollen deploy --gpus`)
        env = dict(self.env, FLWR_HOME=str(home), **(env_extra or {}))
        if self.resident_workers and self.shared_worker:
            env[resident.SOCKET_ENV] = str(self._start_shared_worker(num_partitions))
            env[resident.KEEP_ENV] = str(num_partitions)
        elif self.resident_workers:
            try:
                sock = resident.socket_path(str(home.resolve()))
            except resident.WorkerUnavailable as exc:
                raise LaunchError(f"cannot place the node's worker socket: {exc}") from None
            self._owner_locks.append((sock, resident.hold_owner_lock(sock)))
            env[resident.SOCKET_ENV] = str(sock)
            worker = self.spawn(
                f"worker-{partition_id}",
                resident.worker_argv(sock),
                resident.worker_env(env, app_dir()),  # the code of the app it submits
                track=False,
            )
            self.workers.append(worker)

        def launch() -> list[Proc]:
            port = free_port()
            secret = runner_secret(home) if self.trusted_key else None
            argv = supernode_argv(
                fleet, port, config, tls.ca_cert if tls else None, auth_key, runner_secret=secret
            )
            node = self.spawn(f"supernode-{partition_id}", argv, env)
            if self.trusted_key is None or secret is None:
                return [node]
            runner = app_runner_argv(f"127.0.0.1:{port}", self.trusted_key, node.popen.pid, secret)
            return [node, self.spawn(f"app-runner-{partition_id}", runner, env)]

        procs = launch()
        self.started_nodes[partition_id] = Node(partition_id, launch, procs)
        return procs[0]

    def _start_shared_worker(self, nodes: int) -> Path:
        """The socket of the worker all nodes share, started with the first node."""
        if self._shared_socket is not None:
            return self._shared_socket
        try:
            sock = resident.socket_path(f"{self.workdir.resolve()}#shared")
        except resident.WorkerUnavailable as exc:
            raise LaunchError(f"cannot place the shared worker's socket: {exc}") from None
        self._owner_locks.append((sock, resident.hold_owner_lock(sock)))
        env = dict(self.env, **{resident.SOCKET_ENV: str(sock), resident.KEEP_ENV: str(nodes)})
        worker = self.spawn(
            "worker-shared",
            resident.worker_argv(sock),
            resident.worker_env(env, app_dir()),
            track=False,
        )
        self.workers.append(worker)
        self._shared_socket = sock
        return sock

    def wait_health(self, url: str, proc: Proc, tls: TLS | None, timeout: float = 60) -> None:
        ctx = ssl.create_default_context(cafile=str(tls.ca_cert)) if tls else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise proc.failure()
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise LaunchError(f"{proc.name} not healthy after {timeout:g} s:\n{proc.tail()}")

    def check_alive(self) -> None:
        """Raise LaunchError when a process has exited, unless it belongs to a SuperNode this
        federation restarts (`restart_nodes`): that node is started again after a backoff, on
        the same partition, state directory and key."""
        for proc in list(self.procs):
            if proc not in self.procs or proc.popen.poll() is None:
                continue  # (a process replaced by a restart earlier in this loop)
            node = next((n for n in self.started_nodes.values() if proc in n.procs), None)
            if node is None or not self.restart_nodes or free_mb(self.workdir) < 1:
                raise proc.failure()  # (a node restarted on a full disk would die again)
            self._revive(node, proc)

    def disk_full(self) -> str | None:
        """Which process's log says, since the last call, that the disk is full (Flower's
        SuperLink: `database or disk is full`; any Python process: `No space left on
        device`), in words; None when none does. Reads only what the logs gained."""
        for proc in [*self.procs, *self.workers]:
            path = proc.log_path
            start, carry = self._log_read.get(path, (0, b""))
            try:
                with open(path, "rb") as fh:
                    fh.seek(start)
                    news = fh.read()
            except OSError:
                continue
            self._log_read[path] = (start + len(news), news[-64:])  # a sign cut in two
            if news and no_space((carry + news).decode(errors="replace")):
                return f"{proc.name} could not write (its log: {path})"
        return None

    def _revive(self, node: Node, dead: Proc) -> None:
        now = time.monotonic()
        if node.died_at is None:  # just noticed: stop what is left of it, wait the backoff
            node.died_at, node.exit_code = now, dead.popen.returncode
            for proc in node.procs:
                if proc.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.popen.pid, signal.SIGKILL)
                    proc.popen.wait(timeout=10)
            print(
                f"SuperNode of client {node.partition_id} exited (code {node.exit_code}); "
                f"restarting it",
                flush=True,
            )
            return
        if node.restarts >= NODE_RESTART_LIMIT:
            raise LaunchError(
                f"SuperNode of client {node.partition_id} exited {node.restarts + 1} times "
                f"(last code {node.exit_code}); gave up restarting it:\n{dead.tail()}"
            )
        wait = NODE_RESTART_BACKOFF[min(node.restarts, len(NODE_RESTART_BACKOFF) - 1)]
        if now - node.died_at < wait:
            return
        for proc in node.procs:
            self.procs.remove(proc)
        node.procs = node.launch()
        node.restarts += 1
        record = {
            rundir.Event.KEY: rundir.Event.NODE_RESTARTED,
            "client": node.partition_id,
            "restart": node.restarts,
            "exit-code": node.exit_code,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        node.died_at = node.exit_code = None
        self.restart_log.append(record)
        if self.events is not None:
            line = (json.dumps(record) + "\n").encode()
            fd = os.open(self.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one write: lines the server appends stay whole
            finally:
                os.close(fd)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM each process (SuperNodes deregister), then SIGKILL whatever is left. Workers
        the nodes' ClientApps started again exit once the owner locks are released."""
        self.procs.extend(self.workers)
        self.workers.clear()
        for sock, fd in self._owner_locks:
            resident.release_owner_lock(sock, fd)
        self._owner_locks.clear()
        self._shared_socket = None
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGKILL)  # children (superexec, apps) too
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)
        self.procs.clear()

    def lost_messages(self) -> str:
        """One sentence on what Flower's processes here logged about messages they could not
        deliver (the SuperLink's SQLite "database is locked", a SuperNode's "Failed to send
        message"); empty when they logged none."""
        parts = []
        locked = _count_in(self.workdir / "superlink.log", "database is locked")
        if locked:
            parts.append(
                f"the SuperLink logged {locked} 'database is locked' error(s) "
                f"({self.workdir / 'superlink.log'})"
            )
        unsent = sorted(
            i
            for i in self.started_nodes
            if _count_in(self.workdir / f"supernode-{i}.log", "Failed to send message")
        )
        if unsent:
            shown = ", ".join(map(str, unsent))
            parts.append(f"the SuperNodes of client(s) {shown} failed to send a reply")
        return "; ".join(parts)

    # ---- the flwr CLI --------------------------------------------------------------------
    def write_connection(self, address: str, ca_cert: Path | None) -> None:
        lines = [
            "[superlink]",
            f'default = "{self.connection}"',
            "",
            f"[superlink.{self.connection}]",
            f'address = "{address}"',
        ]
        if ca_cert is None:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{Path(ca_cert).resolve()}"')
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`flwr ARGS`. A call that does not answer within `timeout` (a busy machine) returns
        exit code FLWR_TIMED_OUT with empty output, which every caller already reads as "no
        answer yet" or a failure, instead of raising through the launcher."""
        argv = [bin_path("flwr"), *args]
        try:
            return subprocess.run(
                argv,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.workdir,
                check=False,
            )
        except subprocess.TimeoutExpired:
            reason = f"`flwr {' '.join(args[:2])}` did not answer within {timeout:g} s\n"
            return subprocess.CompletedProcess(argv, FLWR_TIMED_OUT, "", reason)

    def nodes(self) -> list[dict[str, Any]]:
        """The SuperLink's SuperNodes (`flwr supernode ls`): node-id, status, ..."""
        out = self.flwr("supernode", "ls", self.connection, "--format", "json")
        try:
            return list(json.loads(out.stdout).get("nodes", []))
        except json.JSONDecodeError:
            return []

    def wait_reachable(self, address: str, timeout: float = 120, every: float = 10) -> None:
        """Until the SuperLink at `address` answers the flwr CLI (`pollen run` may start before
        it does), saying every `every` seconds what it waits for."""
        start = time.monotonic()
        said = start
        while True:
            out = self.flwr("supernode", "ls", self.connection, "--format", "json", timeout=60)
            try:
                if json.loads(out.stdout).get("success"):
                    return
            except json.JSONDecodeError:
                pass
            waited = time.monotonic() - start
            if waited > timeout:
                raise LaunchError(
                    f"no SuperLink answers at {address} after {timeout:g} s: is `pollen server` "
                    "running there, is this its HTTP API port (--port, not the Fleet port), and "
                    "do --root-certificates match its TLS (none for --insecure)?"
                )
            if time.monotonic() - said >= every:
                said = time.monotonic()
                print(f"waiting for the SuperLink at {address}: {waited:.0f} s", flush=True)
            time.sleep(2.0)

    def online_nodes(self) -> int:
        return sum(1 for n in self.nodes() if n.get("status") == "online")

    def wait_nodes(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if self.online_nodes() >= count:
                return
            time.sleep(1.0)
        raise LaunchError(f"fewer than {count} SuperNodes online after {timeout:g} s")

    def configure_simulation(
        self,
        num_supernodes: int,
        cpus_per_client: int,
        gpus_per_client: float = 0.0,
        num_gpus: int | None = None,
    ) -> None:
        """Simulated SuperNodes and the resources each ClientApp reserves in Ray, for runs on
        this (simulation) SuperLink: `cpus_per_client` CPUs and `gpus_per_client` of a GPU (a
        fraction shares one GPU between clients; Ray hides every GPU from a client that
        reserves none). `num_gpus`: the GPUs the Ray instance Flower starts offers (Ray's
        `num_gpus` of `ray.init`); None lets Ray detect them, and must be None when Flower
        joins an existing cluster (RAY_ADDRESS), whose nodes declare their own."""
        args = [
            "--num-supernodes",
            str(num_supernodes),
            "--client-resources-num-cpus",
            str(cpus_per_client),
        ]
        if gpus_per_client > 0:
            args += ["--client-resources-num-gpus", f"{gpus_per_client:g}"]
        if num_gpus is not None:
            args += ["--init-args-num-gpus", str(num_gpus)]
        done = self.flwr("federation", "simulation-config", "@none/default", self.connection, *args)
        if done.returncode != 0:
            raise LaunchError(f"could not configure the simulation:\n{done.stdout}{done.stderr}")

    def submit(
        self,
        settings: Mapping[str, Scalar],
        federation_config: Mapping[str, Scalar] | None = None,
        app: Path | None = None,
    ) -> str:
        """Start a run of the app in `app` (default: Pollen's own, this checkout), signed with
        `signing_key` when there is one."""
        config_file = self.workdir / "run-config.toml"
        config_file.write_text(run_configtoml_value(settings))
        bundle = app or app_dir()
        if self.signing_key is not None:
            from pollen.tools.signing import (  # lazy: cryptography
                SigningError,
                load_private_key,
                stage_signed_app,
            )

            try:
                key = load_private_key(self.signing_key)
                bundle = stage_signed_app(bundle, self.workdir / "signed-app", key)
            except (SigningError, ValueError) as exc:
                raise LaunchError(f"could not sign the app: {exc}") from None
        args = [
            "run",
            str(bundle),
            self.connection,
            "--run-config",
            str(config_file),
            "--format",
            "json",
        ]
        if federation_config:
            args += [
                "--federation-config",
                " ".join(f"{k}={toml_value(v)}" for k, v in federation_config.items()),
            ]
        out = self.flwr(*args, timeout=300)
        try:
            reply = json.loads(out.stdout)
        except json.JSONDecodeError:
            reply = {}
        if out.returncode != 0 or not reply.get("success") or "run-id" not in reply:
            raise LaunchError(f"flwr run failed:\n{out.stdout}\n{out.stderr}")
        return str(reply["run-id"])

    def run_status(self, run_id: str) -> dict[str, Any]:
        """The run's record from `flwr ls`; empty when unknown for now (no answer in time on a
        loaded machine, or unreadable output): the caller asks again, the run goes on."""
        out = self.flwr("ls", self.connection, "--run-id", run_id, "--format", "json")
        try:
            runs = json.loads(out.stdout).get("runs", [])
        except json.JSONDecodeError:
            return {}
        return dict(runs[0]) if runs else {}

    def stop_run(self, run_id: str) -> None:
        """Best effort: a SuperLink too busy to answer in time must not mask why we stop."""
        self.flwr("stop", run_id, self.connection, timeout=30)

    def server_log(self, run_id: str) -> str:
        """The ServerApp's log; a note instead when `flwr log` does not answer in time (a
        loaded machine), since the run's results are already on disk."""
        out = self.flwr("log", run_id, self.connection, "--show", timeout=60)
        if out.returncode == FLWR_TIMED_OUT:
            return f"(server log of run {run_id} unavailable: {out.stderr.strip()})\n"
        return out.stdout


def _count_in(log: Path, text: str) -> int:
    """How many lines of `log` contain `text` (0 for a log that cannot be read)."""
    try:
        with open(log, errors="replace") as fh:
            return sum(text in line for line in fh)
    except OSError:
        return 0


def _key_digest(public_key: Path) -> str:
    """The key itself (OpenSSH: type and base64 body), not its comment."""
    try:
        body = b" ".join(public_key.read_bytes().split()[:2])
    except OSError as exc:
        raise LaunchError(f"SuperNode key {public_key} cannot be read: {exc.strerror}") from None
    return hashlib.sha256(body).hexdigest()


def _database_identity(record: Path) -> int | None:
    """The inode of the database a key record belongs to (a new database, a new identity)."""
    database = Path(str(record).removesuffix(".registered-keys"))
    try:
        return database.stat().st_ino
    except OSError:
        return None


def _registered_keys(record: Path | None) -> set[str]:
    if record is None:
        return set()
    try:
        saved = json.loads(record.read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(saved, dict) or saved.get("database-inode") != _database_identity(record):
        return set()
    return {str(k) for k in saved.get("keys", [])}


def _write_registered_keys(record: Path, keys: set[str]) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps({"database-inode": _database_identity(record), "keys": sorted(keys)}))
    tmp.replace(record)


def tls_args_superlink(tls: TLS | None) -> list[str]:
    if tls is None:
        return ["--insecure"]
    return [
        "--ssl-ca-certfile",
        str(tls.ca_cert),
        "--ssl-certfile",
        str(tls.server_cert),
        "--ssl-keyfile",
        str(tls.server_key),
    ]


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
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
    print("starting:", " ".join(argv), flush=True)
    node = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
    )  # fmt: skip
    helper = None
    if runner is not None:
        helper = subprocess.Popen(
            runner(node.pid), env=env, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent,
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


def run_configtoml_value(settings: Mapping[str, Scalar]) -> str:
    return "".join(f"{key} = {toml_value(value)}\n" for key, value in settings.items())


# ---- following a run -------------------------------------------------------------------------
STATUS_POLL_MIN = 3.0
STATUS_POLL_MAX = 15.0
STATUS_POLL_ENDING = 1.0  # once the summary is written: the ServerApp is exiting


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def follow(
    fed: Federation,
    run_id: str,
    out_dir: Path,
    timeout: float,
    stream: TextIO = sys.stdout,
    num_rounds: int = 0,
    history: bool = False,
    plain: bool | None = None,
    sinks: Sequence[Sink] = (),
    start_timeout: float = START_TIMEOUT,
) -> dict[str, Any]:
    """Show progress until the run finishes; returns its final status record. The run is
    stopped (LaunchError) when its ServerApp has not started after `start_timeout` seconds, or
    when a process of the federation logs a full disk (DiskFull).

    Each status query is a `flwr ls` process (about a CPU-second of imports), so the run's
    status is asked at once when the server writes its summary.json (at the end of a run, also a
    failed one) and otherwise at intervals growing from STATUS_POLL_MIN to STATUS_POLL_MAX
    seconds: a ServerApp that dies without writing a summary is still noticed. Flower marks the
    run finished only once the ServerApp process has exited, a second or so after the summary,
    so from the summary on the status is asked every STATUS_POLL_ENDING seconds. `plain`: the
    view (pollen.tools.progress; None: plain unless `stream` is a terminal); `sinks` follow the
    results too (TensorBoard)."""
    progress = Progress(
        out_dir, stream, num_rounds, history, plain=plain, clock=time.monotonic, sinks=sinks
    )
    try:
        return _follow(fed, run_id, out_dir, timeout, progress, start_timeout)
    finally:
        progress.close()


class _StatusQuery(threading.Thread):
    """One `flwr ls` in the background, so that progress keeps moving while it runs (a second
    on an idle machine, much longer on a loaded one). A daemon: Ctrl-C never waits for it."""

    def __init__(self, fed: Federation, run_id: str) -> None:
        super().__init__(daemon=True)
        self.fed, self.run_id = fed, run_id
        self.status: dict[str, Any] = {}
        self.start()

    def run(self) -> None:
        self.status = self.fed.run_status(self.run_id)


def _follow(
    fed: Federation,
    run_id: str,
    out_dir: Path,
    timeout: float,
    progress: Progress,
    start_timeout: float = START_TIMEOUT,
) -> dict[str, Any]:
    t0 = time.monotonic()
    deadline = t0 + timeout
    summary = out_dir / rundir.SUMMARY
    summary_seen = before = _mtime(summary)  # a resumed run's directory may hold an old one
    interval = STATUS_POLL_MIN
    next_status = time.monotonic()
    query: _StatusQuery | None = None
    while True:
        progress.poll()
        fed.check_alive()
        full = fed.disk_full()
        if full is not None:
            fed.stop_run(run_id)
            raise DiskFull(full)
        if progress.state.doing == "start" and time.monotonic() - t0 > start_timeout:
            fed.stop_run(run_id)
            log = fed.workdir / "superlink.log"
            where = str(log) if log.exists() else "on the SuperLink's machine"
            raise LaunchError(
                f"run {run_id}: its ServerApp wrote nothing to {out_dir} within "
                f"{start_timeout:g} s of the submission (--start-timeout), so it never started "
                "(a SuperLink with no SuperExec to run it, or Flower's processes failing: "
                f"the SuperLink's log {where} says which); stopped the run"
            )
        written = _mtime(summary)
        if query is None and (written != summary_seen or time.monotonic() >= next_status):
            summary_seen = written
            query = _StatusQuery(fed, run_id)
        if query is not None:
            query.join(timeout=0.1)
            if not query.is_alive():
                status, query = query.status, None
                if str(status.get("status", "")).startswith("finished"):
                    return status
                if summary_seen != before:  # written by this run: it is ending, ask again soon
                    next_status = time.monotonic() + STATUS_POLL_ENDING
                else:
                    next_status = time.monotonic() + interval
                    interval = min(interval * 1.5, STATUS_POLL_MAX)
        if time.monotonic() > deadline:
            fed.stop_run(run_id)
            raise LaunchError(f"run {run_id} did not finish within {timeout:g} s; stopped it")
        time.sleep(0.5)
