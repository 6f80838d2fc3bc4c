"""Keeps `[tool.flwr.app.config]` in pyproject.toml equal to the declared settings."""

from __future__ import annotations

import sys
from pathlib import Path

from pollen.core.runconfig import all_settings
from pollen.core.settings import toml_value

BEGIN, END = "# BEGIN SETTINGS", "# END SETTINGS"


def settings_block() -> str:
    return "\n".join(f"{k} = {toml_value(s.default)}" for k, s in all_settings().items())


def synced(text: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"pyproject.toml lacks the '{BEGIN}' ... '{END}' markers")
    return f"{head}{BEGIN}\n{settings_block()}\n{END}{tail}"


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml")
    text = path.read_text()
    new = synced(text)
    if new != text:
        path.write_text(new)
        print(f"updated {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
