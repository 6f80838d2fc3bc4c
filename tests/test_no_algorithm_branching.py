"""Algorithm code never branches on the run's algorithm name.

A variant is chosen once, where the registry names its code: a strategy class per variant
(`strategy="module:Class"`), a client handler table per variant (`client="module:TABLE"`) that
passes the variant to the shared code as an argument, and explicit arguments of models/
functions. Reading the name to look the registry entry up (client/app.py) or to record it
(server/engine.py) is fine; comparing it, matching on it or indexing a table with it is not.

An `ast` walk over the algorithm code flags:
* comparisons (`==`, `!=`, `in`, ...) and `match` statements on an expression that names the
  algorithm: `...["algorithm"]`, `.get("algorithm")`, a variable or attribute called
  `algorithm` (or `*_algorithm`, `algorithm_*`);
* comparisons with a string constant that is a registered algorithm name (unless that string is
  also a choice of another setting, like 'local' and 'fedavg' of `adept.method`);
* tables indexed by the algorithm (`TABLE[settings["algorithm"]]`, `TABLE.get(algorithm)`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from pollen.core.registry import ALGORITHMS
from pollen.core.runconfig import all_settings

ROOT = Path(__file__).resolve().parent.parent
# the algorithm code: both halves, what they share, models, data and the round engine
SCANNED = ("client", "strategies", "models", "federated_data", "pollen/contracts")
SCANNED_FILES = ("server/engine.py",)


def _files() -> list[Path]:
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    return files + [ROOT / f for f in SCANNED_FILES]


def _ambiguous_names() -> set[str]:
    """Algorithm names that are also values of other settings (`adept.method`'s 'fedavg')."""
    return {
        choice
        for key, setting in all_settings().items()
        if key != "algorithm"
        for choice in setting.choices or ()
    }


ALGORITHM_NAMES = frozenset(ALGORITHMS) - _ambiguous_names()


def _is_algorithm_word(name: str) -> bool:
    return name == "algorithm" or name.endswith("_algorithm") or name.startswith("algorithm_")


def names_algorithm(node: ast.AST) -> bool:
    """Whether an expression is (or converts) the run's algorithm name."""
    if (  # str(settings["algorithm"])
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("str", "repr")
        and len(node.args) == 1
    ):
        return names_algorithm(node.args[0])
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value == "algorithm"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        first = node.args[0] if node.args else None
        return (
            node.func.attr == "get"
            and isinstance(first, ast.Constant)
            and first.value == "algorithm"
        )
    if isinstance(node, ast.Name):
        return _is_algorithm_word(node.id)
    if isinstance(node, ast.Attribute):
        return _is_algorithm_word(node.attr)
    return False


def _algorithm_constants(node: ast.AST) -> list[str]:
    """Registered algorithm names among a comparison operand's string constants (a constant,
    or the elements of a tuple, list or set literal)."""
    elements = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [
        e.value
        for e in elements
        if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in ALGORITHM_NAMES
    ]


def branches(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """(line, reason) for every place in `source` that chooses behaviour by algorithm name."""
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(names_algorithm(o) for o in operands):
                yield node.lineno, "compares the algorithm name"
            for name in (n for o in operands for n in _algorithm_constants(o)):
                yield node.lineno, f"compares with the algorithm name {name!r}"
        elif isinstance(node, ast.Match) and names_algorithm(node.subject):
            yield node.lineno, "matches on the algorithm name"
        elif isinstance(node, ast.Subscript) and names_algorithm(node.slice):
            yield node.lineno, "indexes a table by the algorithm name"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and names_algorithm(node.args[0])
        ):
            yield node.lineno, "looks the algorithm name up in a table"


def test_algorithm_code_never_branches_on_the_algorithm_name() -> None:
    found = []
    for path in _files():
        source = path.read_text()
        lines = source.splitlines()
        for line, reason in branches(source, str(path)):
            found.append(f"{path.relative_to(ROOT)}:{line}: {reason}: {lines[line - 1].strip()}")
    assert not found, (
        "variants are chosen by the registry (a strategy class, a client handler table, an "
        "explicit argument), not by the algorithm name:\n" + "\n".join(found)
    )


def test_the_scan_covers_the_algorithm_code() -> None:
    scanned = {p.relative_to(ROOT).as_posix() for p in _files()}
    assert {"client/app.py", "client/fedavg.py", "strategies/adept.py", "models/ssl_nets.py",
            "server/engine.py"} <= scanned  # fmt: skip
    assert {"fedprox", "fedavg-plus", "adept-pca", "adept-dgm", "fedavg-byol"} <= ALGORITHM_NAMES


@pytest.mark.parametrize(
    "code",
    [
        'if settings["algorithm"] == "adept-pca":\n    pass',
        'pca = env.settings["algorithm"] != "adept-dgm"',
        'net = contrastive_net(s, shape, predictor=settings["algorithm"] == "fedavg-byol")',
        'ok = str(settings["algorithm"]) in ("adept-ae", "adept-dgm")',
        'ok = settings.get("algorithm") == "fedsc"',
        'proximal = algorithm == "fedprox"',
        'adapt = self.algorithm != "fedavg-plus"',
        'if variant == "fedavg-plus":\n    pass',
        'if "adept-pca" == kind:\n    pass',
        'match settings["algorithm"]:\n    case "fedsc":\n        pass',
        'net = NETWORKS[settings["algorithm"]]',
        'net = NETWORKS.get(str(env.settings["algorithm"]))',
    ],
)
def test_the_scan_finds_a_branch(code: str) -> None:
    assert list(branches(code))


@pytest.mark.parametrize(
    "code",
    [
        'spec = get_algorithm(str(env.settings["algorithm"]))',  # the registry look-up
        'row = {"algorithm": settings["algorithm"]}',  # recording the name
        'if settings["adept.method"] in ("fedavg", "fedavg-ft"):\n    pass',  # a setting's value
        'if method != "local":\n    pass',
        'if kind == "unet":\n    pass',
    ],
)
def test_the_scan_leaves_lookups_records_and_other_settings_alone(code: str) -> None:
    assert not list(branches(code))
