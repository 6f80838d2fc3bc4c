#!/usr/bin/env bash
# Creates .venv (or reuses it) and installs Pollen with everything it needs.
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.pollen-install-stamp
want="$(sha256sum pyproject.toml | cut -c1-32)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "installing Pollen and its dependencies into .venv (torch takes a few minutes)"
    .venv/bin/python -m pip install --disable-pip-version-check -q -e ".[dev]"
    echo "$want" > "$stamp"
fi
