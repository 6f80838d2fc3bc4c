"""The results files under a full disk: a line is appended whole or not at all."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest

from pollen.core.rundir import RoundRow, append_line, read_jsonl
from server.results import ResultsWriter


def _row(rnd: int, loss: float) -> RoundRow:
    return RoundRow(rnd, {"loss": loss}, [], 1.0, 2, 3, 0.5)


def test_lines_are_appended_whole(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path)
    writer.round(_row(1, 0.5))
    writer.round(_row(2, 0.25))
    tail = '"bytes-received": 3, "bytes-sent": 2, "codec-seconds": 0.5, "phases": []'
    assert (tmp_path / "metrics.jsonl").read_text() == (
        f'{{{tail}, "round": 1, "seconds": 1.0, "train": {{"loss": 0.5}}}}\n'
        f'{{{tail}, "round": 2, "seconds": 1.0, "train": {{"loss": 0.25}}}}\n'
    )


def test_a_line_the_disk_cannot_take_is_undone(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                      capture_output=True, check=False).returncode != 0:  # fmt: skip
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        path = disk / "metrics.jsonl"
        line = json.dumps({"round": 0, "pad": "x" * 1000}) + "\n"
        written = 0
        with pytest.raises(OSError) as info:
            for _ in range(1000):  # 1 MB: more than the disk holds
                append_line(path, line)
                written += 1
        assert info.value.errno == errno.ENOSPC
        assert written > 0
        assert path.read_text() == line * written  # no half line after the last whole one
        assert len(read_jsonl(path)) == written
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, check=False)
