"""Default locations shared by server, clients and launcher."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pollen.core.settings import RunSettings, Scalar


def cache_dir(settings: Mapping[str, Scalar]) -> Path:
    configured = RunSettings.of(settings).cache_dir
    if configured:
        return Path(configured)
    env = os.environ.get("POLLEN_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "pollen"
