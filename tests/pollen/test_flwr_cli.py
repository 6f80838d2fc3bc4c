"""The `flwr` CLI (pollen.tools.flwr_cli) on a loaded machine: a query that does not answer in
time is unknown for now, not a failure."""

from __future__ import annotations

from pathlib import Path

from pollen.tools.flwr_cli import FlwrCli


def test_a_status_query_that_times_out_is_unknown_not_fatal(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    def slow(*args: object, **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(cmd="flwr ls", timeout=120)

    fed = FlwrCli(tmp_path / "fed")
    monkeypatch.setattr(subprocess, "run", slow)  # the CLI process does not answer in time
    assert fed.run_status("1") == {}


def test_a_server_log_query_that_times_out_leaves_a_note(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    def slow(*args: object, **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(cmd="flwr log", timeout=60)

    fed = FlwrCli(tmp_path / "fed")
    monkeypatch.setattr(subprocess, "run", slow)  # the CLI process does not answer in time
    assert "unavailable" in fed.server_log("7")
    fed.stop_run("7")  # best effort, no exception
