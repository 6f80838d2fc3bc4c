"""A local federation: a SuperLink and SuperNodes started on this machine (each SuperNode
with its resident worker, or one worker they share, and its app runner), the keys the SuperLink
accepts, and the TLS material they use. The processes are supervised as processes.Supervisor
does; runs go through the `flwr` CLI (flwr_cli.FlwrCli)."""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client import resident
from pollen.core.settings import Scalar
from pollen.tools.flwr_cli import FlwrCli, app_dir
from pollen.tools.node_service import app_runner_argv, runner_secret, supernode_argv
from pollen.tools.processes import (
    TASK_POLL_INTERVAL,
    LaunchError,
    Node,
    Proc,
    Supervisor,
    bin_path,
    free_port,
)


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


@dataclass
class LocalFederation(Supervisor, FlwrCli):
    """A set of local Flower processes plus a private FLWR_HOME to talk to them."""

    trusted_key: Path | None = None
    """A public key: SuperNodes started here run only apps signed by its private half."""
    superlink_started: bool = False
    """This federation started a SuperLink before (its database is then kept on a restart)."""
    resident_workers: bool = True
    """Start a resident worker beside every SuperNode (client.worker; its ClientApps relay)."""
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

    def wait_nodes(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if self.online_nodes() >= count:
                return
            time.sleep(1.0)
        raise LaunchError(f"fewer than {count} SuperNodes online after {timeout:g} s")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM each process (SuperNodes deregister), then SIGKILL whatever is left. Workers
        the nodes' ClientApps started again exit once the owner locks are released."""
        for sock, fd in self._owner_locks:
            resident.release_owner_lock(sock, fd)
        self._owner_locks.clear()
        self._shared_socket = None
        super().stop(grace)
