"""Shared fixtures: Flower's task identity for building instructions outside a real run, and
run settings on the small embedded digits data."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flwr.supercore.task_identity import TaskIdentity

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")


@pytest.fixture(autouse=True)
def cold_client_caches() -> Iterator[None]:
    """Each test starts without the partitions a simulated node of an earlier test kept in
    this process (client.env.keep_simulated_data): a test may change how data loads."""
    yield
    env = sys.modules.get("client.env")
    if env is not None:
        env._resident = None  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def task_identity() -> Iterator[None]:
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    yield
    TaskIdentity._task_id = TaskIdentity._run_id = TaskIdentity._node_id = None  # type: ignore[assignment]


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One partition cache for the session: partitions are deterministic, so sharing is safe."""
    return tmp_path_factory.mktemp("partition-cache")


@pytest.fixture
def run_config(tmp_path: Path, shared_cache: Path) -> dict[str, Any]:
    from pollen.core.runconfig import resolve

    return resolve(
        {
            "dataset": "digits",
            "model": "mlp",
            "num-clients": 3,
            "num-rounds": 3,
            "lr": 0.1,
            "batch-size": 16,
            "local-epochs": 1,
            "seed": 1,
            "cache-dir": str(shared_cache),
            "out-dir": str(tmp_path / "out"),
            "run-name": "test",
            "poll-interval": 0.05,
            "phase-timeout": 30.0,
            "wait-for-clients": 5.0,
        }
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (`-n N --dist loadgroup`, as scripts/test.sh runs the suite), the
    end-to-end tests run one after another on one worker: each starts a federation whose
    timeouts assume a share of the machine, and the Ray tests must not meet another test's Ray.
    The other tests spread over the remaining workers."""
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.xdist_group("e2e"))
