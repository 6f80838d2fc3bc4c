#!/usr/bin/env bash
# Set up, then run FedAvg on the embedded MNIST digits: a SuperLink and 3 SuperNodes as
# separate processes talking gRPC on this machine. Extra arguments go to `pollen deploy`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_TELEMETRY_ENABLED=0
exec .venv/bin/pollen deploy --algorithm fedavg --dataset mnist-5k --clients 3 --rounds 3 "$@"
