"""docker-compose.yml and the image, checked without a Docker daemon: the compose files
against the compose-spec schema, every command against the parser of the program it runs
(pinned Flower's own argparse parsers, Pollen's CLI), and the Dockerfile's COPY sources
against the build context."""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from pollen.tools.cli.client import supernode_argv_of
from pollen.tools.cli.parser import build_parser
from pollen.tools.cli.server import superlink_argv
from pollen.tools.local_federation import TLS
from tests.deploy.compose import COMPOSE, GPU, INSECURE, ROOT, commands, load, merged

VARIANTS = {"tls": (COMPOSE,), "insecure": (COMPOSE, INSECURE), "gpu": (COMPOSE, GPU)}


def _compose_schema() -> dict[str, Any]:
    """The compose-spec schema as check-jsonschema vendors it (a test dependency)."""
    spec = importlib.util.find_spec("check_jsonschema")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            "check-jsonschema (a dev dependency, installed by scripts/setup.sh) is missing: "
            "the compose files cannot be checked against the compose-spec schema"
        )
    base = Path(next(iter(spec.submodule_search_locations)))
    schema: dict[str, Any] = json.loads(
        (base / "builtin_schemas" / "vendor" / "compose-spec.json").read_text()
    )
    return schema


@pytest.mark.parametrize("path", [COMPOSE, INSECURE, GPU], ids=lambda p: p.name)
def test_compose_files_follow_the_compose_spec(path: Path) -> None:
    import jsonschema

    schema = _compose_schema()
    jsonschema.validate(load(path), schema)
    doc = load(path)
    doc["services"][next(iter(doc["services"]))]["portz"] = ["1:1"]
    with pytest.raises(jsonschema.ValidationError, match="portz"):
        jsonschema.validate(doc, schema)


def _flower_parser(binary: str) -> argparse.ArgumentParser:
    """The argparse parser the pinned Flower binary itself uses."""
    if binary == "flower-superlink":
        from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink

        return _parse_args_run_superlink()
    if binary == "flower-supernode":
        from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

        return _parse_args_run_supernode()
    from flwr.supercore.cli.flower_superexec import _parse_args

    assert binary == "flower-superexec", binary
    return _parse_args()


def _flower_accepts(argv: list[str]) -> argparse.Namespace:
    parser = _flower_parser(Path(argv[0]).name)
    parser.exit_on_error = False
    try:
        return parser.parse_args(argv[1:])
    except SystemExit as exc:  # unknown flags and bad choices exit
        raise AssertionError(f"{argv[0]} rejects {argv[1:]}") from exc


def _pollen_accepts(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"pollen rejects {argv}") from exc


def _flower_commands(argv: list[str]) -> list[list[str]]:
    """The Flower command lines a compose command ends up running."""
    if argv[0] == "flower-superexec":
        return [argv]
    if argv[0] == "docker/supernode.sh":
        state, clients, keys, *rest = argv[1:]
        extra = ["--auth-key", f"{keys}/node-0.key", "--peer-keys", keys] if keys else []
        argv = ["pollen", "client", "--partition-id", "0", "--num-partitions", clients,
                "--state-dir", f"{state}/client-0", *extra, *rest]  # fmt: skip
    if argv[0] in ("docker/credentials.sh", "docker/run.sh"):
        assert (ROOT / argv[0]).stat().st_mode & 0o111
        if argv[0] == "docker/credentials.sh":
            assert int(argv[6]) >= 1
        return []
    assert argv[0] == "pollen", argv
    args = _pollen_accepts(argv[1:])
    if args.command == "server":
        tls = None
        if args.tls_dir:
            d = Path(args.tls_dir)
            tls = TLS(d / "ca.crt", d / "server.pem", d / "server.key")
        return [superlink_argv(args, tls)]
    if args.command == "client":
        return [supernode_argv_of(args)]
    assert args.command == "run", args.command
    return []


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_command_is_one_flower_and_pollen_accept(variant: str) -> None:
    doc = merged(*VARIANTS[variant], env={"POLLEN_CLIENTS": "4", "POLLEN_ALGORITHM": "fedem"})
    cmds = commands(doc)
    assert set(cmds) == {"certs", "superlink", "serverapp", "supernode", "run"}
    assert doc["services"]["supernode"]["deploy"]["replicas"] == 4
    flower = {name: _flower_commands(argv) for name, argv in cmds.items()}
    for runs in flower.values():
        for argv in runs:
            _flower_accepts(argv)
    superlink = _flower_accepts(flower["superlink"][0])
    supernode = _flower_accepts(flower["supernode"][0])
    superexec = _flower_accepts(flower["serverapp"][0])
    run = _pollen_accepts(run_script(doc["services"]["run"], Path(tempfile.mkdtemp()))[1:])
    assert run.algorithm == "fedem" and run.clients == 4
    assert superlink.runtime_dependency_install is False
    assert superlink.isolation == "process"  # the ServerApp runs in the serverapp container
    assert superexec.runtime_api_address == f"superlink:{superlink.port}"
    assert supernode.superlink == superlink.fleet_api_address.replace("0.0.0.0", "superlink")
    assert run.superlink == f"superlink:{superlink.port}"
    secure = variant != "insecure"
    assert superlink.insecure is not secure and superlink.enable_supernode_auth is secure
    assert (supernode.root_certificates is not None) is secure
    assert (supernode.auth_supernode_private_key is not None) is secure
    assert superexec.insecure is not secure and (run.root_certificates is not None) is secure
    # least privilege: the HTTP API is exposed on the compose network only (published on the
    # host's loopback), the SuperExec proves the shared secret, only signed apps run
    server = _pollen_accepts(cmds["superlink"][1:])
    assert server.expose_api and server.insecure is not secure
    ports = doc["services"]["superlink"]["ports"]
    assert [p for p in ports if p.endswith(":9093")] == ["127.0.0.1:9093:9093"]
    assert superlink.superexec_auth_secret_file == superexec.superexec_auth_secret_file
    client = _pollen_accepts(["client", *_flower_client_args(cmds["supernode"])])
    assert client.trusted_key == "/certs/signing.pub" and not client.allow_any_app
    assert run.signing_key == "/certs/signing.key"


def _flower_client_args(argv: list[str]) -> list[str]:
    state, clients, _keys, *rest = argv[1:]
    return ["--partition-id", "0", "--num-partitions", clients, "--state-dir", state, *rest]


def test_each_service_gets_only_its_share_of_the_credentials(tmp_path: Path) -> None:
    """docker/credentials.sh makes every credential once and hands each service only what it
    needs; compose mounts each share into its own service alone."""
    doc = load(COMPOSE)
    argv = commands(doc)["certs"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in doc["services"]["certs"]["volumes"]}
    shares = [str(tmp_path / s) for s in ("superlink", "serverapp", "supernode", "run")]
    assert argv[2:6] == [f"/out/{s}" for s in ("superlink", "serverapp", "supernode", "run")]
    done = subprocess.run(["bash", str(ROOT / argv[0]), str(tmp_path / "all"), *shares, "2",
                           "superlink"], capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr

    def files(service: str) -> set[str]:
        root = tmp_path / service
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    nodes = {f"supernodes/node-{i}" for i in range(2)}
    assert files("superlink") == {"ca.crt", "server.pem", "server.key", "superexec.secret"} | {
        f"{n}.pub" for n in nodes
    }
    assert files("serverapp") == {"ca.crt", "superexec.secret"}
    assert files("supernode") == {"ca.crt", "signing.pub"} | {
        f"{n}.{kind}" for n in nodes for kind in ("key", "pub")
    }  # its own key, and the registered nodes' public keys it takes secure-aggregation keys from
    assert files("run") == {"ca.crt", "signing.key"}
    for private in ("superlink/server.key", "run/signing.key", "serverapp/superexec.secret"):
        assert (tmp_path / private).stat().st_mode & 0o077 == 0, private
    # the certs service writes each share into the volume that only its service mounts
    for service in ("superlink", "serverapp", "supernode", "run"):
        volume = mounts[f"/out/{service}"]
        users = [name for name, spec in doc["services"].items()
                 if any(v.split(":")[0] == volume for v in spec.get("volumes", []))]  # fmt: skip
        assert sorted(users) == sorted(["certs", service]), (volume, users)
    keeper = mounts["/credentials"]
    users = [name for name, spec in doc["services"].items()
             if any(v.split(":")[0] == keeper for v in spec.get("volumes", []))]  # fmt: skip
    assert users == ["certs"]  # the CA key never leaves the certs service


def run_script(service: dict[str, Any], tmp: Path, **env: str) -> list[str]:
    """The `pollen` command line docker/run.sh runs with the service's environment."""
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "pollen").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    (bindir / "pollen").chmod(0o755)
    full = {k: str(v) for k, v in service.get("environment", {}).items()}
    full.update(env, PATH=f"{bindir}:{os.environ['PATH']}")
    done = subprocess.run(["bash", str(ROOT / service["command"][0]), *service["command"][1:]],
                          env=full, capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return ["pollen", *done.stdout.splitlines()]


def test_each_run_gets_a_fresh_results_directory_unless_one_is_named(tmp_path: Path) -> None:
    service = load(COMPOSE, {"POLLEN_ALGORITHM": "fedem", "POLLEN_DATASET": "digits"})
    run = service["services"]["run"]
    first = _pollen_accepts(run_script(run, tmp_path)[1:])
    assert first.out.startswith("/results/fedem-digits-") and not first.resume
    time.sleep(1.1)
    assert _pollen_accepts(run_script(run, tmp_path)[1:]).out != first.out
    named = load(COMPOSE, {"POLLEN_RUN": "exp1", "POLLEN_RESUME": "1", "POLLEN_ROUNDS": "9",
                           "POLLEN_SET": "secagg.enabled=true lr=0.05"})  # fmt: skip
    words = run_script(named["services"]["run"], tmp_path)
    again = _pollen_accepts(words[1:])
    assert again.out == "/results/exp1" and again.resume and again.rounds == 9
    assert again.set == ["secagg.enabled=true", "lr=0.05"]
    bad = load(COMPOSE, {"POLLEN_RESUME": "1"})["services"]["run"]
    done = subprocess.run(["bash", str(ROOT / "docker" / "run.sh"), "/r"], capture_output=True,
                          text=True, check=False,
                          env={k: str(v) for k, v in bad["environment"].items()})  # fmt: skip
    assert done.returncode == 2 and "POLLEN_RESUME=1 needs POLLEN_RUN" in done.stderr


def test_a_runs_settings_reach_only_the_run_service() -> None:
    """Compose recreates a container when its configuration changes: another run's settings
    must change the `run` service alone, or every `docker/up.sh` with new settings would restart
    the SuperLink and the SuperNodes under it (the next run then sends to nodes that are gone)."""
    one = {"POLLEN_ALGORITHM": "fedavg", "POLLEN_DATASET": "digits", "POLLEN_ROUNDS": "2"}
    other = {"POLLEN_ALGORITHM": "fedem", "POLLEN_DATASET": "mnist-5k", "POLLEN_ROUNDS": "9",
             "POLLEN_RUN": "exp1", "POLLEN_RESUME": "1",
             "POLLEN_SET": "secagg.enabled=true"}  # fmt: skip
    for files in VARIANTS.values():
        first, second = merged(*files, env=one), merged(*files, env=other)
        changed = [name for name in first["services"]
                   if first["services"][name] != second["services"][name]]  # fmt: skip
        assert changed == ["run"], changed
        assert second["services"]["run"]["environment"]["POLLEN_ROUNDS"] == "9"


def test_only_one_service_builds_the_image_that_all_of_them_run() -> None:
    for files in VARIANTS.values():
        doc = merged(*files)
        builders = [name for name, spec in doc["services"].items() if "build" in spec]
        assert builders == ["certs"], builders
        images = {spec["image"] for spec in doc["services"].values()}
        assert len(images) == 1, images
        assert all(spec.get("pull_policy") == "never" for spec in doc["services"].values())
    gpu = merged(COMPOSE, GPU)
    assert gpu["services"]["certs"]["build"]["args"]["TORCH_INDEX_URL"] == "https://pypi.org/simple"
    devices = gpu["services"]["supernode"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


def test_services_wait_for_a_ready_superlink() -> None:
    for files in VARIANTS.values():
        doc = merged(*files)
        superlink = doc["services"]["superlink"]
        ready = _pollen_accepts(superlink["command"][1:]).ready_file
        assert superlink["healthcheck"]["test"] == ["CMD", "test", "-f", ready]
        for name in ("serverapp", "supernode", "run"):
            after = doc["services"][name]["depends_on"]["superlink"]
            assert after == {"condition": "service_healthy"}, name


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = Path(rel).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.removeprefix("**/"))
        for pat in patterns
        for p in prefixes + list(parts)
    )


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    copies = [line.split()[1:] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert copies
    patterns = _dockerignore()
    for args in copies:
        sources = [a for a in args[:-1] if not a.startswith("--")]
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the build context"
            assert not _ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
    copied = {src.split("/")[0] for args in copies for src in args[:-1]}
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert set(packages) <= copied, "every Python package of the app goes into the image"
    # runtime dependency installation is off in the image
    assert "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in dockerfile
    for service in ("certs", "superlink", "supernode", "serverapp", "run"):
        argv0 = commands(load(COMPOSE))[service][0]
        if "/" in argv0:
            assert f"COPY {argv0} " in dockerfile, f"{service} runs {argv0}, not in the image"
    assert "flwr[simulation]>=1.39.0,<1.40" in project["project"]["dependencies"]


def test_generate_certs_makes_keys_flower_loads(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )

    script = ROOT / "scripts" / "generate-certs.sh"
    subprocess.run(["bash", str(script), str(tmp_path), "--nodes", "2", "superlink", "10.0.0.1"],
                   check=True, capture_output=True)  # fmt: skip
    node0 = tmp_path / "supernodes" / "node-0.key"
    first = (tmp_path / "ca.crt").read_bytes(), node0.read_bytes()
    text = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "server.pem"), "-noout",
                           "-text"], check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert "DNS:superlink" in text and "IP Address:10.0.0.1" in text
    for i in range(2):
        key = load_ssh_private_key((tmp_path / "supernodes" / f"node-{i}.key").read_bytes(), None)
        pub = load_ssh_public_key((tmp_path / "supernodes" / f"node-{i}.pub").read_bytes())
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert key.public_key() == pub
    # running it again adds keys and keeps what was handed out
    subprocess.run(["bash", str(script), str(tmp_path), "--nodes", "3"], check=True,
                   capture_output=True)  # fmt: skip
    again = (tmp_path / "ca.crt").read_bytes(), node0.read_bytes()
    assert again == first and (tmp_path / "supernodes" / "node-2.pub").exists()


def _supernode_script(tmp_path: Path) -> Any:
    """docker/supernode.sh with a stand-in `pollen` that prints its arguments."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "pollen"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    script = ROOT / "docker" / "supernode.sh"

    def start(host: str, keys: str = "/k", **env: str) -> subprocess.CompletedProcess[str]:
        full = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", HOSTNAME=host,
                    POLLEN_LEASE_WAIT="1", POLLEN_LEASE_BEAT="1", **env)  # fmt: skip
        return subprocess.run(["bash", str(script), str(tmp_path / "state"), "2", keys,
                               "--superlink", "s:1"], env=full, check=False,
                              capture_output=True, text=True, timeout=30)  # fmt: skip

    return start


def _hold(state: Path, partition: int, owner: str, age: float = 0.0) -> None:
    """A lease as a running SuperNode holds it, its last heartbeat `age` seconds ago."""
    lease = state / "claims" / str(partition)
    lease.mkdir(parents=True)
    (lease / "owner").write_text(f"{owner}\n")
    (lease / "heartbeat").touch()
    then = time.time() - age
    os.utime(lease / "heartbeat", (then, then))


def test_supernode_script_gives_each_replica_its_own_partition(tmp_path: Path) -> None:
    """Scaled SuperNode containers lease distinct partitions; a restarted one keeps its own."""
    start, state = _supernode_script(tmp_path), tmp_path / "state"
    _hold(state, 0, "node-a")
    out_b = start("node-b")
    assert out_b.returncode == 0, out_b.stderr
    assert "--partition-id 1 --num-partitions 2" in out_b.stdout
    assert (f"--state-dir {state}/client-1 --auth-key /k/node-1.key --peer-keys /k "
            "--superlink s:1") in out_b.stdout  # fmt: skip
    assert not (state / "claims" / "1").exists()  # released on a clean exit
    _hold(state, 1, "node-b")
    again = start("node-a", keys="")  # node-a restarted: its own lease, not node-b's
    assert "--partition-id 0" in again.stdout and "--auth-key" not in again.stdout
    _hold(state, 0, "node-a")
    full = start("node-c")
    assert full.returncode == 1 and "leased by live SuperNodes" in full.stderr


def test_a_dead_holders_lease_expires_and_a_replacement_takes_it_over(tmp_path: Path) -> None:
    """A SuperNode killed without a clean stop (SIGKILL, `docker compose down` and `up`) leaves
    its lease behind; once its heartbeat is older than the expiry, a new SuperNode takes the
    partition over instead of finding every partition taken."""
    start, state = _supernode_script(tmp_path), tmp_path / "state"
    _hold(state, 0, "alive", age=2)
    _hold(state, 1, "killed", age=120)
    done = start("replacement", POLLEN_LEASE_EXPIRY="30")
    assert done.returncode == 0, done.stderr
    assert "partition 1's lease expired (holder killed)" in done.stdout
    assert "--partition-id 1 " in done.stdout
    assert (state / "claims" / "0" / "owner").read_text().strip() == "alive"
    # a holder that just beat is alive: nothing is taken from it
    _hold(state, 1, "alive-too", age=1)
    busy = start("late", POLLEN_LEASE_EXPIRY="30")
    assert busy.returncode == 1 and "waiting for one to be released" in busy.stdout


def test_the_lease_heartbeat_runs_while_the_node_lives(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "pollen").write_text("#!/bin/sh\nsleep 4\n")
    (bindir / "pollen").chmod(0o755)
    state = tmp_path / "state"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", HOSTNAME="n",
               POLLEN_LEASE_BEAT="1")  # fmt: skip
    proc = subprocess.Popen(["bash", str(ROOT / "docker" / "supernode.sh"), str(state), "1", ""],
                            env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        beat = state / "claims" / "0" / "heartbeat"
        deadline = time.monotonic() + 10
        while not beat.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        first = beat.stat().st_mtime
        time.sleep(2.5)
        assert beat.stat().st_mtime > first
    finally:
        assert proc.wait(timeout=20) == 0
    assert not (state / "claims" / "0").exists()
