"""The results files under a full disk: a line is appended whole or not at all."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest

from pollen.core.rundir import append_line, read_jsonl
from server.results import ResultsWriter


def test_lines_are_appended_whole(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path)
    writer.round({"round": 1, "train": {"loss": 0.5}})
    writer.round({"round": 2, "train": {"loss": 0.25}})
    assert (tmp_path / "metrics.jsonl").read_text() == (
        '{"round": 1, "train": {"loss": 0.5}}\n{"round": 2, "train": {"loss": 0.25}}\n'
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
