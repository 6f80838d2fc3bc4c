"""What `pollen deploy` starts on one machine, without starting it: a SuperLink without a
database file, one resident worker shared by the SuperNodes, and a run that does not require
every client unless told to; and the line naming what Flower's processes lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from pollen.tools import cli
from pollen.tools.cli import deploy, simulate
from pollen.tools.local_federation import LocalFederation


class RecordingFederation:
    made: ClassVar[list[RecordingFederation]] = []

    def __init__(self, workdir: Path, **kwargs: Any) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir, self.kwargs = workdir, kwargs
        self.env: dict[str, str] = {}
        RecordingFederation.made.append(self)

    def spread_task_polls(self, nodes: int) -> None:
        self.polled_by = nodes

    def start_superlink(self, **kwargs: Any) -> tuple[int, int]:
        return 0, 1

    def configure_simulation(self, *args: Any) -> None:
        pass

    def sign_apps_with_new_key(self) -> None:
        pass

    def register_nodes(self, keys: Any) -> int:
        return 0

    def start_supernode(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_nodes(self, count: int) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    RecordingFederation.made = []
    submitted: list[dict[str, Any]] = []

    def record(fed: Any, resolved: dict[str, Any], *args: Any, **kwargs: Any) -> int:
        submitted.append(resolved)
        return 0

    monkeypatch.setattr(deploy, "LocalFederation", RecordingFederation)
    monkeypatch.setattr(simulate, "LocalFederation", RecordingFederation)
    monkeypatch.setattr(deploy, "run_and_report", record)
    monkeypatch.setattr(simulate, "run_and_report", record)
    monkeypatch.setattr(simulate, "simulate_run", record)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return submitted


def _main(argv: list[str], out: Path, cache: Path) -> int:
    return cli.main([*argv, "--dataset", "digits", "--clients", "4", "--rounds", "1",
                     "--out", str(out), "--set", f"cache-dir={cache}"])  # fmt: skip


def test_deploy_shares_one_worker_keeps_no_database_and_does_not_require_every_client(
    runs: list[dict[str, Any]], tmp_path: Path, shared_cache: Path
) -> None:
    assert _main(["deploy"], tmp_path / "a", shared_cache) == 0
    fed = RecordingFederation.made[-1]
    assert fed.kwargs["shared_worker"] is True and fed.kwargs["superlink_database"] is False
    assert runs[-1]["num-clients"] == 4 and runs[-1]["min-available-clients"] == 1
    assert fed.polled_by == 5  # the nodes' SuperExecs and the ServerApp's

    strict = ["deploy", "--set", "min-available-clients=4", "--worker-per-node"]
    assert _main(strict, tmp_path / "b", shared_cache) == 0
    assert RecordingFederation.made[-1].kwargs["shared_worker"] is False
    assert runs[-1]["min-available-clients"] == 4

    on_disk = ["deploy", "--superlink-database", str(tmp_path / "state.db")]
    assert _main(on_disk, tmp_path / "d", shared_cache) == 0
    assert RecordingFederation.made[-1].kwargs["superlink_database"] == tmp_path / "state.db"

    assert _main(["simulate"], tmp_path / "c", shared_cache) == 0  # unchanged: every client
    assert runs[-1]["min-available-clients"] == 4


def test_task_polls_spread_with_the_nodes_per_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    fed = LocalFederation(tmp_path / "a")
    fed.spread_task_polls(17)
    assert fed.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.85"
    fed.spread_task_polls(2)
    assert fed.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.1"
    monkeypatch.setenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.5")  # the operator's is kept
    fed = LocalFederation(tmp_path / "b")
    before = fed.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"]
    fed.spread_task_polls(17)
    assert fed.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == before


def test_lost_messages_names_the_database_lock_and_the_nodes_that_could_not_send(
    tmp_path: Path,
) -> None:
    fed = LocalFederation(tmp_path / "processes")
    assert fed.lost_messages() == ""
    (fed.workdir / "superlink.log").write_text(
        "ERROR: (sqlite3.OperationalError) database is locked\nINFO ok\n"
        "ERROR: (sqlite3.OperationalError) database is locked\n"
    )
    for i in (3, 7):
        fed.started_nodes[i] = None  # type: ignore[assignment]  # only the ids are read
    (fed.workdir / "supernode-7.log").write_text("ERROR: Failed to send message abc: Internal\n")
    (fed.workdir / "supernode-3.log").write_text("INFO: Sent successfully\n")
    text = fed.lost_messages()
    assert text.startswith("the SuperLink logged 2 'database is locked' error(s)")
    assert text.endswith("the SuperNodes of client(s) 7 failed to send a reply")
