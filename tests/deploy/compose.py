"""Reading docker-compose.yml the way `docker compose` does (interpolation, override files),
so tests can check its commands and the network-namespace test can run them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
INSECURE = ROOT / "docker-compose.insecure.yml"
GPU = ROOT / "docker-compose.gpu.yml"
_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """`${VAR:-default}` / `${VAR-default}` / `${VAR}` as compose substitutes them."""

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        value = env.get(name)
        return value if value else (default or "")

    return _VAR.sub(sub, text)


def load(path: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(interpolate(path.read_text(), env or {}))
    return doc


def merged(*paths: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Later files override earlier ones service by service (commands replace)."""
    result: dict[str, Any] = {}
    for path in paths:
        doc = load(path, env)
        for key, value in doc.items():
            if key == "services":
                services = result.setdefault("services", {})
                for name, service in value.items():
                    services[name] = {**services.get(name, {}), **service}
            elif isinstance(value, dict):
                result[key] = {**result.get(key, {}), **value}
            else:
                result[key] = value
    return result


def commands(doc: Mapping[str, Any]) -> dict[str, list[str]]:
    return {name: list(s["command"]) for name, s in doc["services"].items() if "command" in s}
