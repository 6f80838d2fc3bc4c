"""Fixtures: a session-wide source cache (embedded datasets converted once) and an isolated
dataset registry per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from federated_data import registry


@pytest.fixture(scope="session")
def source_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cache root shared by tests that load mnist-5k or digits (read-only after first use)."""
    return tmp_path_factory.mktemp("federated-data-cache")


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Datasets registered by a test vanish after it; the default cache is a temp dir."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setenv("POLLEN_CACHE_DIR", str(tmp_path / "default-cache"))
    yield
