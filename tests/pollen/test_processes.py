"""The watch over Flower's processes (pollen.tools.processes): a full disk in their logs, a node
that dies on a full disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from pollen.tools import processes
from pollen.tools.processes import DiskFull, Supervisor


def test_a_full_disk_in_a_log_is_news_only_once_and_only_if_new(tmp_path: Path) -> None:
    """`Supervisor.disk_full` reads what each process's log gained: a full disk an earlier
    process logged (the log of the run a resume continues) is not news."""
    fed = Supervisor(tmp_path)
    (tmp_path / "superlink.log").write_text("ERROR: (sqlite3.OperationalError) database or "
                                            "disk is full\n")  # fmt: skip
    proc = fed.spawn("superlink", ["sleep", "30"])
    try:
        assert fed.disk_full() is None
        with open(proc.log_path, "a") as log:
            log.write("INFO: fine\nOSError: [Errno 28] No space left on device\n")
        assert fed.disk_full() == f"superlink could not write (its log: {proc.log_path})"
        assert fed.disk_full() is None  # said once
    finally:
        fed.stop()


def test_a_node_that_dies_on_a_full_disk_is_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pollen deploy` restarts a SuperNode that dies, except when the disk is full: a node
    restarted there would die again, 8 times over two minutes, before the run failed."""
    fed = Supervisor(tmp_path, restart_nodes=True)
    node = fed.spawn("supernode-0", ["true"])
    fed.started_nodes[0] = processes.Node(0, lambda: [fed.spawn("supernode-0", ["true"])], [node])
    node.popen.wait()
    monkeypatch.setattr(processes, "free_mb", lambda path: 0.0)
    with pytest.raises(
        DiskFull, match=r"no space left on device in .* supernode-0 exited \(code 0\)"
    ):
        fed.check_alive()
    monkeypatch.setattr(processes, "free_mb", lambda path: 500.0)
    fed.check_alive()  # room on the disk: noted for a restart after the backoff
    assert fed.started_nodes[0].died_at is not None
    fed.stop()
