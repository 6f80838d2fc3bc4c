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
    # (grep drops pip's notes about unused local package indexes; pipefail keeps pip's status)
    .venv/bin/python -m pip install --disable-pip-version-check -q -e ".[dev]" 2>&1 \
        | { grep -v "^WARNING: Location .* is ignored" || true; }
    echo "$want" > "$stamp"
fi
