#!/usr/bin/env bash
# Train every registered algorithm for one round on CUDA and on the CPU, in simulation and in
# deployment (2 clients, embedded data), and print the seconds per round of each
# (docs/deployment.md#gpu). Without a CUDA GPU it says so in one line and exits 0.
# Arguments go to scripts/gpu_check.py, e.g. `scripts/gpu-check.sh --algorithms fedavg --amp`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" scripts/gpu_check.py "$@"
