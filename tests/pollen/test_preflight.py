"""The checks `pollen server`, `pollen client` and the run commands make before Flower starts:
each mistake one PreflightError naming the option, the value and the problem."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest

from pollen.tools import preflight
from pollen.tools.preflight import PreflightError


@pytest.mark.parametrize("text", ["0", "65536", "-1", "abc", "9092x", ""])
def test_a_port_is_a_number_from_1_to_65535(text: str) -> None:
    with pytest.raises(PreflightError, match="is not a port number"):
        preflight.port_number(text)
    assert preflight.port_number("9092") == 9092


def test_a_port_another_program_listens_on_is_named(taken_port: int) -> None:
    with pytest.raises(PreflightError, match=f"--fleet-port {taken_port}: port {taken_port} on "
                       "127.0.0.1 is already in use by another program"):  # fmt: skip
        preflight.check_port_free("127.0.0.1", taken_port, "--fleet-port")


def test_a_free_port_passes_and_is_left_free() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    preflight.check_port_free("127.0.0.1", port, "--port")
    with socket.socket() as again:  # the check let it go
        again.bind(("127.0.0.1", port))


def test_an_address_of_another_machine_is_named() -> None:
    with pytest.raises(PreflightError, match=r"192.0.2.1 is not an address of this machine"):
        preflight.check_port_free("192.0.2.1", 9092, "--fleet-host")


def test_database_checks(tmp_path: Path) -> None:
    preflight.check_database(":memory:")
    preflight.check_database(str(tmp_path / "new.db"))  # a new file in an existing directory
    real = tmp_path / "real.db"
    sqlite3.connect(real).execute("create table t (x)").connection.close()
    preflight.check_database(str(real))
    (tmp_path / "empty.db").touch()
    preflight.check_database(str(tmp_path / "empty.db"))
    with pytest.raises(PreflightError, match=r"the directory .*missing/dir does not exist"):
        preflight.check_database(str(tmp_path / "missing" / "dir" / "superlink.db"))
    with pytest.raises(PreflightError, match="is a directory; give the database file's path"):
        preflight.check_database(str(tmp_path))
    (tmp_path / "junk.db").write_text("not a database\n")
    with pytest.raises(PreflightError, match="is not an SQLite database"):
        preflight.check_database(str(tmp_path / "junk.db"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(PreflightError, match="is a file, not a directory"):
        preflight.check_database(str(tmp_path / "afile" / "superlink.db"))
    assert not (tmp_path / "missing").exists()  # nothing created


def test_directory_checks(tmp_path: Path) -> None:
    preflight.check_writable_dir(tmp_path / "new" / "deeper", "--state-dir")
    assert not (tmp_path / "new").exists()  # checked, not created
    (tmp_path / "afile").write_text("x")
    with pytest.raises(PreflightError, match=r"--state-dir .*afile is a file, not a directory"):
        preflight.check_writable_dir(tmp_path / "afile", "--state-dir")
    with pytest.raises(PreflightError, match="cannot be written"):
        preflight.check_writable_dir(Path("/proc/pollen-nope"), "--state-dir")
    preflight.check_input_dir(tmp_path, "--data-dir")
    with pytest.raises(PreflightError, match=r"--data-dir .*afile is a file, not a directory"):
        preflight.check_input_dir(tmp_path / "afile", "--data-dir")
    with pytest.raises(PreflightError, match=r"--data-dir .*nothing does not exist"):
        preflight.check_input_dir(tmp_path / "nothing", "--data-dir")
    with pytest.raises(PreflightError, match=r"--auth-key .*nothing.key does not exist"):
        preflight.check_readable_file(tmp_path / "nothing.key", "--auth-key")
    with pytest.raises(PreflightError, match="is a directory, not a file"):
        preflight.check_readable_file(tmp_path, "--auth-key")


def test_free_space_is_that_of_the_filesystem_that_would_hold_the_path(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)],
                             capture_output=True, check=False).returncode == 0  # fmt: skip
    if not mounted:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        assert 3.5 < preflight.free_mb(small / "not" / "yet") <= 4.0
        says = r"no space left on device \(only 4\.0 MB free on its filesystem; a run needs at"
        with pytest.raises(PreflightError, match=says + r" least 64 MB\)"):
            preflight.check_free_space(small / "run", "--out")
        preflight.check_free_space(small / "run", "--out", need_mb=1)
    finally:
        subprocess.run(["umount", str(small)], capture_output=True, check=False)

