"""Imports inside functions are there only where a lazy heavy import is the point, and each says
so: a `# lazy: <why>` comment on its line (`# lazy: torch`, `# lazy: heavy data code`, ...).
Every other import belongs at the top of its module.

Why laziness matters: Flower starts a fresh ClientApp process for every message, so the ClientApp
(client.app, client.env) imports torch and the data and model code only once a handler that
needs them runs; the command line and the algorithm registry stay light too. The last test
checks those entry points in a fresh interpreter.
"""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "pollen", "server", "client", "strategies", "models", "federated_data", "robust", "secagg",
)
MARK = "# lazy:"


def _marked(comment: str) -> bool:
    """A comment that starts with `# lazy:` and gives a reason."""
    return comment.startswith(MARK) and bool(comment[len(MARK) :].strip())


def unmarked_function_imports(source: str, name: str = "<source>") -> list[str]:
    """`name:line: import` for every import inside a function (or method) with no `# lazy:`
    comment on any of its lines."""
    comments: dict[int, list[str]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments.setdefault(token.start[0], []).append(token.string)
    found: list[str] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                lines = range(child.lineno, (child.end_lineno or child.lineno) + 1)
                if not any(_marked(c) for line in lines for c in comments.get(line, [])):
                    found.append(f"{name}:{child.lineno}: {ast.unparse(child)}")
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(ast.parse(source), False)
    return found


def test_every_function_level_import_says_why_it_is_lazy() -> None:
    found = [
        line
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in unmarked_function_imports(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], (
        "function-level imports without a `# lazy: <why>` comment (move them to the top of "
        "the module unless deferring a heavy import is the point):\n" + "\n".join(found)
    )


def test_the_check_flags_an_unmarked_function_level_import() -> None:
    source = '''
import json  # module level: nothing to say

def marked():
    import torch  # lazy: torch
    import numpy as np  # lazy: torch  # noqa: F401
    from federated_data import (  # lazy: heavy data code
        load_client_data,
    )

def unmarked():
    import difflib

async def unmarked_async():
    from pathlib import Path  # noqa: F401

def empty_reason():
    import torch  # lazy:

def not_first():
    import torch  # noqa: F401  # lazy: torch

class Model:
    def method(self):
        def inner():
            import matplotlib
'''
    flagged = [line.split(": ", 1)[1] for line in unmarked_function_imports(source)]
    assert flagged == [
        "import difflib",
        "from pathlib import Path",
        "import torch",
        "import torch",
        "import matplotlib",
    ]


@pytest.mark.parametrize(
    "module", ["client.app", "client.env", "pollen.tools.cli", "pollen.core.registry"]
)
def test_light_entry_points_do_not_import_torch(module: str) -> None:
    heavy = ("torch", "torchvision", "matplotlib", "sklearn")
    code = f"import sys, {module}; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0"},
    )
    assert done.stdout.strip() == "[]", f"import {module} loaded {done.stdout.strip()}"
