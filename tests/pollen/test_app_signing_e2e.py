"""Only the operator's apps run on Pollen's SuperNodes: real SuperLink and SuperNodes over gRPC
on loopback, each SuperNode beside Pollen's app runner (pollen/tools/app_runner.py), as `pollen
client` and `pollen deploy` start them. A foreign app bundle submitted straight through `flwr
run`, one signed with another key and one altered after signing are refused by every SuperNode
before any of their code runs; the operator's signed run completes. And the reason Pollen signs
bundles itself: Flower 1.39's own `--trusted-entities` refuses even the operator's bundle."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from pollen.core.runconfig import resolve
from pollen.core.settings import Scalar
from pollen.tools.local_federation import LocalFederation
from pollen.tools.node_service import supernode_argv
from pollen.tools.processes import free_port
from pollen.tools.signing import (
    SIGNATURE_FILE,
    generate_key,
    key_id,
    load_private_key,
    stage_signed_app,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
FOREIGN = Path(__file__).resolve().parent / "foreign_app"


def _finished(fed: LocalFederation, run_id: str, timeout: float = 240) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = fed.run_status(run_id)
        if str(status.get("status", "")).startswith("finished"):
            return status
        time.sleep(2)
    raise AssertionError(f"run {run_id} did not finish within {timeout} s")


def _foreign_replies(fed: LocalFederation, run_id: str) -> list[str]:
    _finished(fed, run_id)
    log = fed.server_log(run_id)
    return [line.split("foreign app reply:", 1)[1].strip() for line in log.splitlines()
            if "foreign app reply:" in line]  # fmt: skip


def test_only_the_operators_signed_app_runs_on_the_supernodes(
    tmp_path: Path, shared_cache: Path
) -> None:
    fed = LocalFederation(tmp_path / "fed")
    fed.sign_apps_with_new_key()
    operator = fed.signing_key
    assert operator is not None
    stranger_key = tmp_path / "stranger.key"
    generate_key(stranger_key)
    try:
        _, fleet = fed.start_superlink()
        for i in range(2):
            fed.start_supernode(i, 2, f"127.0.0.1:{fleet}",
                                node_config={"state-dir": str(tmp_path / f"state{i}")})  # fmt: skip
        fed.wait_nodes(2)
        marker = tmp_path / "foreign-marker"
        settings: dict[str, Scalar] = {"marker": str(marker), "nodes": 2}

        # 1. a foreign bundle, unsigned, straight through `flwr run`
        fed.signing_key = None
        replies = _foreign_replies(fed, fed.submit(settings, app=FOREIGN))
        assert len(replies) == 2 and all("is not signed" in r for r in replies), replies

        # 2. the same bundle signed with a key the nodes do not trust
        fed.signing_key = stranger_key
        replies = _foreign_replies(fed, fed.submit(settings, app=FOREIGN))
        stranger = key_id(load_private_key(stranger_key).public_key())
        assert len(replies) == 2 and all(f"signed by key {stranger}" in r for r in replies)

        # 3. the operator's signature on a bundle altered after signing
        staged = stage_signed_app(FOREIGN, tmp_path / "altered", load_private_key(operator))
        (staged / "foreign_app.py").write_text(
            (staged / "foreign_app.py").read_text() + "\nALTERED = True\n"
        )
        fed.signing_key = None  # submit the altered copy as it is, signature included
        replies = _foreign_replies(fed, fed.submit(settings, app=staged))
        assert len(replies) == 2 and all("does not match its content" in r for r in replies)
        assert (staged / SIGNATURE_FILE).exists()
        assert not marker.exists(), "foreign code ran on a SuperNode"
        for i in range(2):
            log = (fed.workdir / f"app-runner-{i}.log").read_text(errors="replace")
            assert "pollen-clientapp: refused to run the app" in log

        # 4. the operator's own signed bundle runs
        fed.signing_key = operator
        assert not marker.exists()
        out = tmp_path / "out"
        run = resolve({"algorithm": "local", "dataset": "digits", "num-clients": 2,
                       "num-rounds": 1, "final-eval": False, "poll-interval": 0.5,
                       "cache-dir": str(shared_cache), "out-dir": str(out),
                       "run-name": "signed"})  # fmt: skip
        status = _finished(fed, fed.submit(run))
        assert status["status"] == "finished:completed", status
        assert (out / "summary.json").exists()
    finally:
        fed.stop()


def test_flowers_own_trusted_entities_refuse_even_the_operators_bundle(tmp_path: Path) -> None:
    """Why Pollen signs bundles itself: a SuperNode started with Flower 1.39's
    `--trusted-entities` refuses a bundle submitted from a directory whoever signed it, since
    only apps from Flower's online hub carry verification records."""
    fed = LocalFederation(tmp_path / "fed")
    key = tmp_path / "operator.key"
    generate_key(key)
    entities = tmp_path / "trusted-entities.yaml"
    kind, public = key.with_suffix(".pub").read_text().split()[:2]
    entities.write_text(f'{key_id(load_private_key(key).public_key())}: "{kind} {public}"\n')
    try:
        _, fleet = fed.start_superlink()
        argv = supernode_argv(f"127.0.0.1:{fleet}", free_port(),
                              {"partition-id": 0, "num-partitions": 1}, None, None)  # fmt: skip
        node = fed.spawn("supernode-flower-trust", [*argv, "--trusted-entities", str(entities)],
                         dict(fed.env, FLWR_HOME=str(tmp_path / "node")))  # fmt: skip
        fed.wait_nodes(1)
        fed.signing_key = key
        marker = tmp_path / "marker"
        replies = _foreign_replies(fed, fed.submit({"marker": str(marker), "nodes": 1},
                                                   app=FOREIGN))  # fmt: skip
        assert len(replies) == 1 and not marker.exists()
        log = node.log_path.read_text(errors="replace")
        assert "App verification is not supported by the connected SuperLink" in log
    finally:
        fed.stop()
        shutil.rmtree(tmp_path / "node", ignore_errors=True)
