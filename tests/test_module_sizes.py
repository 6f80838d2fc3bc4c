"""Rooms with one job each: no module of the packages over 600 lines and no function over 100
(tests, benchmarks and experiments aside). A module that outgrows this is split along its jobs,
as the engine, the launcher, the command line and the report were."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "pollen", "server", "client", "strategies", "models", "federated_data", "robust", "secagg",
)
MODULE_LINES = 600
FUNCTION_LINES = 100


def _sources() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def test_no_module_is_over_600_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := p.read_text().count("\n")) > MODULE_LINES}  # fmt: skip
    assert long == {}


def test_no_function_is_over_100_lines() -> None:
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert long == {}


def test_the_scan_sees_every_package() -> None:
    seen = {p.relative_to(ROOT).parts[0] for p in _sources()}
    assert seen == set(PACKAGES)
