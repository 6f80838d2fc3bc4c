"""The `pollen` command refuses to start when a package of another distribution or directory
shadows one of Pollen's top-level packages (pollen.tools.entry)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

from pollen.tools import entry

ROOT = Path(__file__).resolve().parents[2]


def test_the_check_knows_every_package_the_wheel_installs() -> None:
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    assert {"pollen", *entry.PACKAGES} == set(wheel["targets"]["wheel"]["packages"])


def test_pollens_own_packages_pass() -> None:
    assert entry.foreign_package() is None


def _entry(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # first on the path, before Pollen's
    program = "import sys; from pollen.tools.entry import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", program, *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_package_of_the_same_name_elsewhere_is_one_line_and_nothing_starts(
    tmp_path: Path,
) -> None:
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "__init__.py").write_text("raise SystemExit('imported')\n")
    done = _entry(tmp_path, "--help")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pollen: error: the package 'server' Python imports is ")
    assert str(tmp_path / "server") in lines[0] and "virtual environment" in lines[0]


def test_a_module_in_place_of_a_package_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text("x = 1\n")
    done = _entry(tmp_path, "--help")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"pollen: error: Python finds a module at {tmp_path / 'models.py'} for Pollen's package "
        f"'models', which belongs in {ROOT}: reinstall Pollen (pip install -e . in its checkout)"
    ]


def test_without_a_shadow_the_command_runs(tmp_path: Path) -> None:
    done = _entry(tmp_path, "algorithms")
    assert done.returncode == 0 and "fedem" in done.stdout, done.stderr
