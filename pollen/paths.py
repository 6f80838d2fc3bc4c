"""Default locations shared by server, clients and launcher."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pollen.settings import Scalar


def cache_dir(settings: Mapping[str, Scalar]) -> Path:
    if settings.get("cache-dir"):
        return Path(str(settings["cache-dir"]))
    env = os.environ.get("POLLEN_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "pollen"
