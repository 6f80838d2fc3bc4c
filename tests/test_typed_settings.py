"""Settings are read typed, through a SettingsGroup (pollen.core.settings: RunSettings, each
algorithm's group in its contract module), never as `settings["fedsc.mu"]`: a string-keyed read
of a settings mapping outside the settings layer fails this test.

The settings layer (pollen/core/settings.py, pollen/core/runconfig.py) resolves, checks and
compares whole mappings; `pollen report` (pollen/tools/runs.py, pollen/tools/report.py) and
pollen/tools/experiment.py parse files (a run's config.json of any version, an experiment's
TOML), not a run's settings. Writes (`resolved["out-dir"] = ...`, the command line composing a
run's settings) are not reads.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pollen.core.runconfig import all_settings

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("client", "strategies", "server", "models", "federated_data", "pollen")
SETTINGS_LAYER = {"pollen/core/settings.py", "pollen/core/runconfig.py", "pollen/tools/runs.py",
                  "pollen/tools/report.py", "pollen/tools/experiment.py"}  # fmt: skip
KEYS = set(all_settings())


def _sources() -> list[Path]:
    files = [p for d in CHECKED for p in sorted((ROOT / d).rglob("*.py"))]
    return [p for p in files if str(p.relative_to(ROOT)) not in SETTINGS_LAYER]


SETTINGS_NAMES = {"settings", "cfg", "resolved", "run_config", "overrides"}
"""Names a settings mapping goes by; a key of a group (`fedsc.mu`) counts in any mapping."""


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def string_keyed_reads(source: str) -> list[tuple[int, str]]:
    """(line, key) of every read `x[KEY]` or `x.get(KEY, ...)` with KEY a declared setting's
    key as a string constant: of a group's key (`fedsc.mu`) in any mapping, of a common key
    (`lr`, `seed`) in a mapping named like settings (generator parameters and message configs
    have keys such as `seed` and `lr` of their own)."""
    tree = ast.parse(source)
    stores = {
        id(t) for node in ast.walk(tree) if isinstance(node, ast.Assign | ast.AugAssign)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
    }  # fmt: skip
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        key, mapping = None, ""
        if isinstance(node, ast.Subscript) and id(node) not in stores:
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                key, mapping = node.slice.value, _name(node.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            key, mapping = node.args[0].value, _name(node.func.value)
        if key in KEYS and ("." in key or mapping in SETTINGS_NAMES):
            found.append((getattr(node, "lineno", 0), key))
    return found


def test_the_check_finds_what_it_forbids() -> None:
    code = 'a = settings["fedsc.mu"]\nb = env.settings.get("lr", 0.1)\ncfg["out-dir"] = "x"\n'
    assert string_keyed_reads(code) == [(1, "fedsc.mu"), (2, "lr")]
    assert string_keyed_reads('reply["arrays"]\nmetrics.get("test-accuracy")\n') == []
    assert string_keyed_reads('p["seed"]\nconfig.get("lr")\nparams["fedsc.mu"]\n') == [
        (3, "fedsc.mu")
    ]


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_string_keyed_settings_read(path: Path) -> None:
    assert string_keyed_reads(path.read_text()) == []
