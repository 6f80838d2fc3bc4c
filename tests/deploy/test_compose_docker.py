"""docker-compose.yml against a real Docker daemon, as an operator runs it: `docker/up.sh`
builds, starts the federation, follows the run to its end and exits with its status.
TLS + authentication and the insecure variant each finish 2 clients x 2 rounds; a normal start
has no failed SuperNode; a SuperNode container killed with SIGKILL, then `down` (volumes kept)
and `up` again: its replacement takes over the dead node's lease and the run finishes, and a
kept SuperLink database (POLLEN_SUPERLINK_DATABASE) is not registered again; a second run gets
its own results directory; sixteen SuperNodes on one machine (`--scale supernode=16`) finish
3 rounds.

Skipped, with the reason, where no Docker daemon with Compose v2 answers, or where the image
cannot be built because the torch wheel index it would use (POLLEN_TORCH_INDEX, default
PyTorch's CPU index) does not answer."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.compose import INSECURE, ROOT

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.slow]
DEFAULT_INDEX = "https://download.pytorch.org/whl/cpu"
SETTINGS = {"POLLEN_CLIENTS": "2", "POLLEN_ROUNDS": "2", "POLLEN_DATASET": "digits"}


def _unavailable() -> str | None:
    """Why compose cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no `docker` command"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                          capture_output=True, text=True, check=False, timeout=30)  # fmt: skip
    if info.returncode != 0:
        return f"no Docker daemon answers: {info.stderr.strip()[:200]}"
    version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True,
                             check=False, timeout=30)  # fmt: skip
    if version.returncode != 0:
        return "Docker Compose v2 (`docker compose`) is not installed"
    index = os.environ.get("POLLEN_TORCH_INDEX") or DEFAULT_INDEX
    try:
        with urllib.request.urlopen(f"{index.rstrip('/')}/torch/", timeout=10):
            pass
    except (urllib.error.URLError, OSError) as exc:
        return f"the torch wheel index {index} does not answer ({exc}); set POLLEN_TORCH_INDEX"
    return None


@pytest.fixture(scope="module")
def compose() -> None:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def project(compose: None) -> Iterator[str]:
    name = f"pollentest{os.getpid()}"
    yield name
    subprocess.run(["docker", "compose", "-p", name, "down", "--volumes", "--remove-orphans"],
                   cwd=ROOT, capture_output=True, check=False, timeout=300)  # fmt: skip


def _up(project: str, *files: Path, timeout: float = 900,
        **settings: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    args = [a for f in files for a in ("-f", str(f))]
    return subprocess.run(["bash", str(ROOT / "docker" / "up.sh"), "-p", project, *args],
                          cwd=ROOT, env=dict(os.environ, **{**SETTINGS, **settings}),
                          capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


def _compose(project: str, *args: str) -> str:
    done = subprocess.run(["docker", "compose", "-p", project, *args], cwd=ROOT,
                          env=dict(os.environ, **SETTINGS), capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    return done.stdout + done.stderr


def _runs(project: str) -> list[str]:
    """The results directories in the project's `results` volume."""
    listing = _compose(project, "run", "--rm", "--no-deps", "--entrypoint", "ls", "run",
                       "/results")  # fmt: skip
    return sorted(line for line in listing.split() if line.startswith("fedavg-digits-"))


def _completed(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "completed; results in /results/fedavg-digits-" in done.stdout
    assert "round 2" in done.stdout


def test_a_tls_federation_runs_to_the_end_and_runs_again(project: str) -> None:
    _completed(_up(project))
    nodes = _compose(project, "logs", "supernode")
    assert "serves partition 0 of 2" in nodes and "serves partition 1 of 2" in nodes
    # the SuperNodes waited for the registered allow-list: none was refused or restarted
    assert "Failed to activate SuperNode" not in nodes and "pollen: error" not in nodes
    states = _compose(project, "ps", "--all", "--format", "{{.Service}} {{.ExitCode}}")
    assert "supernode 0" in states
    superlink = _compose(project, "logs", "superlink")
    assert "allow-list: 2 SuperNode keys from /certs/supernodes (2 newly registered)" in superlink
    federation = _compose(project, "ps", "--format", "{{.ID}} {{.Service}}")
    # a second run, the same command: a results directory of its own
    _completed(_up(project))
    # a third with other settings: only the `run` container is made anew, so the SuperNodes
    # that served the last run serve this one (no instruction to a node that is gone)
    third = _up(project, POLLEN_ROUNDS="3")
    _completed(third)
    assert "round 3" in third.stdout and "Node Unavailable" not in third.stdout
    assert _compose(project, "ps", "--format", "{{.ID}} {{.Service}}") == federation
    assert len(_runs(project)) == 3


def test_a_killed_supernode_is_replaced_after_down_and_up(project: str) -> None:
    kept = "/state/superlink.db"  # the SuperLink's state in its file, kept in its volume
    _completed(_up(project, POLLEN_SUPERLINK_DATABASE=kept))
    victim = _compose(project, "ps", "--format", "{{.Name}}", "supernode").split()[0]
    subprocess.run(["docker", "kill", "--signal", "KILL", victim], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    _compose(project, "down")  # containers go, volumes (leases, SuperLink database) stay
    again = _up(project, POLLEN_SUPERLINK_DATABASE=kept)
    _completed(again)
    nodes = _compose(project, "logs", "supernode")
    assert "lease expired" in nodes, nodes[-3000:]
    superlink = _compose(project, "logs", "superlink")
    assert "(0 newly registered)" in superlink and "already in use" not in superlink
    assert len(_runs(project)) == 2


def test_the_insecure_variant_runs_to_the_end(project: str) -> None:
    done = _up(project, ROOT / "docker-compose.yml", INSECURE)
    _completed(done)
    superlink = _compose(project, "-f", "docker-compose.yml", "-f", str(INSECURE), "logs",
                         "superlink")  # fmt: skip
    assert "pollen: warning: --insecure" in superlink


def test_sixteen_supernodes_on_one_machine_finish_a_run(project: str) -> None:
    """`POLLEN_CLIENTS=16 docker compose up --scale supernode=16`: sixteen SuperNode
    containers on one machine (with the SuperLink's state in memory, the default) each lease a
    partition and the run finishes its 3 rounds (docs/reliability.md: what the SuperLink's
    SQLite file did to the same federation)."""
    done = _up(project, timeout=1800, POLLEN_CLIENTS="16", POLLEN_ROUNDS="3")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "completed; results in /results/fedavg-digits-" in done.stdout
    assert "query.hello: 16 clients answered from 16 nodes" in done.stdout
    assert "round 3/3" in done.stdout and "16/16 valid replies" in done.stdout
    nodes = _compose(project, "logs", "supernode")
    assert all(f"serves partition {i} of 16" in nodes for i in range(16))
