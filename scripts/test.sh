#!/usr/bin/env bash
# Set up, then lint, type-check and run the whole test suite (unit and end-to-end).
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not e2e"`. The tests run on
# POLLEN_TEST_WORKERS pytest-xdist workers (default: the number of CPUs, at least 2); the
# end-to-end ones one after another on one of them (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"; .venv/bin/mypy .
echo "== import contracts"; .venv/bin/lint-imports
workers="${POLLEN_TEST_WORKERS:-$(( $(nproc) > 2 ? $(nproc) : 2 ))}"
echo "== pytest ($workers workers)"
.venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
