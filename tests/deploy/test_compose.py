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
from pathlib import Path
from typing import Any

import pytest

from pollen import cli
from pollen.launcher import TLS
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
        return cli.build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"pollen rejects {argv}") from exc


def _flower_commands(argv: list[str]) -> list[list[str]]:
    """The Flower command lines a compose command ends up running."""
    if argv[0] == "flower-superexec":
        return [argv]
    if argv[0] == "docker/supernode.sh":
        state, clients, keys, *rest = argv[1:]
        extra = ["--auth-key", f"{keys}/node-0.key"] if keys else []
        argv = ["pollen", "client", "--partition-id", "0", "--num-partitions", clients,
                "--state-dir", f"{state}/client-0", *extra, *rest]  # fmt: skip
    if argv[0] == "docker/credentials.sh":
        assert (ROOT / argv[0]).stat().st_mode & 0o111
        assert int(argv[3]) >= 1
        return []
    assert argv[0] == "pollen", argv
    args = _pollen_accepts(argv[1:])
    if args.command == "server":
        tls = None
        if args.tls_dir:
            d = Path(args.tls_dir)
            tls = TLS(d / "ca.crt", d / "server.pem", d / "server.key")
        return [cli.superlink_argv(args, tls)]
    if args.command == "client":
        return [cli.supernode_argv_of(args)]
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
    run = _pollen_accepts(cmds["run"][1:])
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
    script = str(ROOT / argv[0])
    done = subprocess.run(["bash", script, str(tmp_path / "all"), str(tmp_path), "2", "superlink"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr

    def files(service: str) -> set[str]:
        root = tmp_path / service
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    nodes = {f"supernodes/node-{i}" for i in range(2)}
    assert files("superlink") == {"ca.crt", "server.pem", "server.key", "superexec.secret"} | {
        f"{n}.pub" for n in nodes
    }
    assert files("serverapp") == {"ca.crt", "superexec.secret"}
    assert files("supernode") == {"ca.crt", "signing.pub"} | {f"{n}.key" for n in nodes}
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


def test_supernode_script_gives_each_replica_its_own_partition(tmp_path: Path) -> None:
    """Scaled SuperNode containers claim distinct partitions; a restarted one keeps its own."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "pollen"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    state = tmp_path / "state"
    script = ROOT / "docker" / "supernode.sh"

    def start(host: str, keys: str = "/k") -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", HOSTNAME=host)
        return subprocess.run(["bash", str(script), str(state), "2", keys, "--superlink", "s:1"],
                              env=env, check=False, capture_output=True, text=True,
                              timeout=30)  # fmt: skip

    # the claim is released when the node exits, so hold one by hand as a running node would
    (state / "claims" / "0").mkdir(parents=True)
    (state / "claims" / "0" / "owner").write_text("node-a\n")
    out_b = start("node-b")
    assert out_b.returncode == 0, out_b.stderr
    assert "--partition-id 1 --num-partitions 2" in out_b.stdout
    assert f"--state-dir {state}/client-1 --auth-key /k/node-1.key --superlink s:1" in out_b.stdout
    (state / "claims" / "1").mkdir()
    (state / "claims" / "1" / "owner").write_text("node-b\n")
    again = start("node-a", keys="")
    assert "--partition-id 0" in again.stdout and "--auth-key" not in again.stdout
    assert not (state / "claims" / "0").exists()  # released on exit
    (state / "claims" / "0").mkdir()
    (state / "claims" / "0" / "owner").write_text("node-a\n")
    full = start("node-c")
    assert full.returncode == 1 and "all 2 partitions are taken" in full.stderr
