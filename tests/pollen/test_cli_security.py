"""Security options of `pollen server`/`deploy`/`client` refuse incomplete set-ups before any
process starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pollen import cli
from pollen.launcher import allow_list, node_key

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "generate-certs.sh"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["server", "--auth"], "needs TLS"),
        (["server", "--allow-list", "keys"], "--allow-list is for --auth"),
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
    with pytest.raises(cli.LaunchError, match="--nodes N"):
        node_key(tmp_path, 1)
    with pytest.raises(cli.LaunchError, match="no SuperNode public keys"):
        allow_list(tmp_path)


def test_client_passes_its_key_and_ca_to_the_supernode() -> None:
    args = cli.build_parser().parse_args(
        ["client", "--superlink", "10.0.0.1:9092", "--partition-id", "1", "--num-partitions",
         "2", "--root-certificates", "ca.crt", "--auth-key", "node-1.key"]
    )  # fmt: skip
    argv = cli.supernode_argv_of(args)
    assert argv[argv.index("--root-certificates") + 1] == "ca.crt"
    assert argv[argv.index("--auth-supernode-private-key") + 1] == "node-1.key"
    assert "--insecure" not in argv
