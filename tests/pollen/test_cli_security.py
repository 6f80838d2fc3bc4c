"""Security options of `pollen server`/`deploy`/`client` refuse incomplete set-ups before any
process starts."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from pollen.tools import cli
from pollen.tools.cli.client import supernode_argv_of
from pollen.tools.cli.parser import build_parser
from pollen.tools.cli.server import _server_warnings, superlink_argv
from pollen.tools.local_federation import TLS, allow_list, node_key
from pollen.tools.processes import LaunchError

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "generate-certs.sh"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["server", "--insecure", "--auth"], "needs TLS"),
        (["server", "--insecure", "--allow-list", "keys"], "--allow-list is for --auth"),
        (["deploy", "--dataset", "digits", "--clients", "2", "--auth"], "needs TLS"),
    ],
)
def test_authentication_without_tls_is_refused(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if argv[0] == "deploy":
        argv = [*argv, "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "processes").exists()


def test_missing_node_keys_are_named(tmp_path: Path) -> None:
    subprocess.run(["bash", str(SCRIPT), str(tmp_path), "--nodes", "1"], check=True,
                   capture_output=True)  # fmt: skip
    assert node_key(tmp_path, 0).name == "node-0.key"
    assert [p.name for p in allow_list(tmp_path / "supernodes")] == ["node-0.pub"]
    with pytest.raises(LaunchError, match="--nodes N"):
        node_key(tmp_path, 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LaunchError, match="no SuperNode public keys"):
        allow_list(tmp_path / "empty")


def test_client_passes_its_key_and_ca_to_the_supernode() -> None:
    args = build_parser().parse_args(
        ["client", "--superlink", "10.0.0.1:9092", "--partition-id", "1", "--num-partitions",
         "2", "--root-certificates", "ca.crt", "--auth-key", "node-1.key", "--trusted-key",
         "signing.pub", "--peer-keys", "peers"]
    )  # fmt: skip
    argv = supernode_argv_of(args)
    assert argv[argv.index("--root-certificates") + 1] == "ca.crt"
    assert argv[argv.index("--auth-supernode-private-key") + 1] == "node-1.key"
    assert "--insecure" not in argv
    # its ClientApp signs its secure-aggregation keys with the node key, takes the peers' only
    node = argv[argv.index("--node-config") + 1]
    assert f'secagg-key="{Path("node-1.key").resolve()}"' in node
    assert f'secagg-peers="{Path("peers").resolve()}"' in node


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(SCRIPT), str(d), "--nodes", "1"], check=True,
                   capture_output=True)  # fmt: skip
    return d


def _client(*extra: str) -> list[str]:
    return ["client", "--superlink", "127.0.0.1:9092", "--partition-id", "0",
            "--num-partitions", "2", *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["server"], "no TLS material: give --tls-dir DIR"),
        (["server", "--insecure", "--tls-dir", "certs"], "contradict"),
        (["server", "--insecure", "--api-host", "0.0.0.0"], "add --expose-api to mean it"),
        (["server", "--insecure", "--superexec-auth-secret-file", "s"], "--isolation process"),
        (["server", "--insecure", "--isolation", "process", "--superexec-auth-secret-file",
          "/nonexistent/secret"], "cannot be read"),
        (_client("--allow-any-app"), "no TLS material: give --root-certificates"),
        (_client("--insecure"), "no --trusted-key"),
        (_client("--insecure", "--allow-any-app", "--trusted-key", "k.pub"), "contradict"),
        (_client("--insecure", "--trusted-key", "/nonexistent/k.pub"), "cannot be read"),
        (["client", "--superlink", "server.example.org", "--partition-id", "0",
          "--num-partitions", "2", "--insecure", "--allow-any-app"], "is not HOST:PORT"),
        (["client", "--superlink", "h:9092", "--partition-id", "2", "--num-partitions", "2",
          "--insecure", "--allow-any-app"], "is not one of the 2 partitions"),
        (_client("--insecure", "--allow-any-app", "--max-wait-time", "0"), "must be positive"),
    ],
)  # fmt: skip
def test_server_and_client_refuse_what_they_were_not_told_to_allow(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_key_of_the_wrong_kind_is_refused_as_trusted_key(
    certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node_pub = certs / "supernodes" / "node-0.pub"  # ECDSA, not ed25519
    assert cli.main(_client("--insecure", "--trusted-key", str(node_pub))) == 2
    assert "is not an ed25519 key" in capsys.readouterr().err


def _server_args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["server", "--insecure", *extra])


def test_the_http_api_binds_to_loopback_unless_exposed() -> None:
    closed = superlink_argv(_server_args(), None)
    assert closed[closed.index("--host") + 1] == "127.0.0.1"
    assert closed[closed.index("--fleet-api-address") + 1] == "0.0.0.0:9092"
    assert "--insecure" in closed
    opened = superlink_argv(_server_args("--expose-api"), None)
    assert opened[opened.index("--host") + 1] == "0.0.0.0"


def test_each_permission_given_is_said_in_one_line(certs: Path) -> None:
    args = _server_args("--expose-api", "--isolation", "process")
    lines = _server_warnings(args, "0.0.0.0", None)
    assert len(lines) == 4
    assert any("--insecure" in line and "unencrypted" in line for line in lines)
    assert any("no --auth" in line and "0.0.0.0:9092" in line for line in lines)
    assert any("--expose-api" in line and "run code" in line for line in lines)
    assert any("--superexec-auth-secret-file" in line for line in lines)
    secure = build_parser().parse_args(
        ["server", "--tls-dir", str(certs), "--auth", "--isolation", "process",
         "--superexec-auth-secret-file", str(certs / "superexec.secret")]
    )  # fmt: skip
    assert _server_warnings(secure, "127.0.0.1", certs / "superexec.secret") == []
    argv = superlink_argv(secure, TLS.from_dir(certs))
    assert argv[argv.index("--superexec-auth-secret-file") + 1] == str(
        (certs / "superexec.secret").resolve()
    )


def test_generate_certs_makes_the_signing_key_and_the_superexec_secret(certs: Path) -> None:
    from pollen.tools.signing import key_id, load_private_key, load_public_key

    key = load_private_key(certs / "signing.key")
    assert key_id(key.public_key()) == key_id(load_public_key(certs / "signing.pub"))
    secret = certs / "superexec.secret"
    assert len(secret.read_bytes()) == 64
    for private in (secret, certs / "signing.key"):
        assert private.stat().st_mode & 0o077 == 0
