"""The layering rules that name algorithms, checked with the algorithms found from the registry
(pyproject.toml's import-linter contracts hold the rules that name no algorithm). So adding an
algorithm changes no contract: its halves are whatever its registry entry names.

- no server half imports another algorithm's server half (directly or through others);
- no module shared inside strategies/ or client/ (helpers, the ClientApp) imports a half;
- nothing imports the ClientApp module or the ServerApp module.
"""

from __future__ import annotations

import grimp
import pytest

from pollen.core.registry import ALGORITHMS

PACKAGES = (
    "pollen", "server", "client", "strategies", "models", "federated_data", "robust", "secagg",
)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # annotation-only imports (under TYPE_CHECKING) do not count, as for import-linter
    return grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)


def _module(path: str) -> str:
    return path.partition(":")[0]


SERVER_HALVES = {_module(spec.strategy) for spec in ALGORITHMS.values()}
CLIENT_HALVES = {_module(spec.client) for spec in ALGORITHMS.values()}


def test_the_registry_names_halves_in_their_packages() -> None:
    assert all(m.startswith("strategies.") for m in SERVER_HALVES), SERVER_HALVES
    assert all(m.startswith("client.") for m in CLIENT_HALVES), CLIENT_HALVES
    assert {"strategies.fedem", "strategies.fedlrt"} <= SERVER_HALVES


def test_no_server_half_imports_another_algorithms(graph: grimp.ImportGraph) -> None:
    found = [
        (a, b)
        for a in sorted(SERVER_HALVES)
        for b in sorted(SERVER_HALVES - {a})
        if graph.chain_exists(importer=a, imported=b)
    ]
    assert found == [], found


@pytest.mark.parametrize(("package", "halves"), [("strategies", SERVER_HALVES),
                                                 ("client", CLIENT_HALVES)])  # fmt: skip
def test_shared_modules_import_no_half(
    graph: grimp.ImportGraph, package: str, halves: set[str]
) -> None:
    shared = graph.find_children(package) - halves
    assert shared, package
    found = [
        (module, half)
        for module in sorted(shared)
        for half in sorted(halves)
        if graph.chain_exists(importer=module, imported=half)
    ]
    assert found == [], found


def test_nothing_imports_the_apps(graph: grimp.ImportGraph) -> None:
    for app in ("client.app", "server.app"):
        assert graph.find_modules_that_directly_import(app) == set(), app
