"""The `pollen` command's entry point. Before the command line imports anything of Pollen's, it
checks that the top-level packages Python finds (server, client, strategies, ...) are the ones
installed beside this `pollen` package, not another distribution's of the same name
(docs/architecture.md#package-names)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGES = ("server", "client", "strategies", "models", "federated_data", "robust", "secagg")
"""Pollen's top-level packages besides `pollen` (the wheel installs them beside it)."""


def foreign_package() -> str | None:
    """Why a package Python would import under one of Pollen's names is not Pollen's; None when
    every one is."""
    root = Path(__file__).resolve().parents[2]
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            found = "no such package" if spec is None else f"a module at {spec.origin}"
            return (
                f"Python finds {found} for Pollen's package '{name}', which belongs in {root}: "
                "reinstall Pollen (pip install -e . in its checkout)"
            )
        where = Path(next(iter(spec.submodule_search_locations))).resolve()
        if where.parent != root:
            return (
                f"the package '{name}' Python imports is {where}, not Pollen's ({root / name}): "
                "another distribution or directory on the path has a top-level package of that "
                "name; run Pollen in a virtual environment of its own"
            )
    return None


def main() -> int:
    problem = foreign_package()
    if problem is not None:
        print(f"pollen: error: {problem}", file=sys.stderr)
        return 2
    from pollen.tools.cli import main as cli_main  # lazy: only after the package check

    return cli_main()
