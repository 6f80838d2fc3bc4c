#!/usr/bin/env bash
# The compose `run` service: signs and submits one run to the SuperLink and follows it to its
# end (exit 0 only when it completed). Each run gets a fresh results directory in RESULTS,
# <algorithm>-<dataset>-<UTC time>, unless POLLEN_RUN names one; POLLEN_RESUME=1 continues the
# run in POLLEN_RUN from its last checkpoint (with more rounds: POLLEN_ROUNDS). POLLEN_SET holds
# more settings, KEY=VALUE separated by spaces (each one `--set KEY=VALUE`).
# Usage: docker/run.sh RESULTS [pollen run options ...]
set -euo pipefail
results="${1:?usage: docker/run.sh RESULTS [pollen run options ...]}"
shift
algorithm="${POLLEN_ALGORITHM:-fedavg}"
dataset="${POLLEN_DATASET:-mnist-5k}"
name="${POLLEN_RUN:-$algorithm-$dataset-$(date -u +%Y%m%d-%H%M%S)}"
args=(run --algorithm "$algorithm" --dataset "$dataset" --clients "${POLLEN_CLIENTS:-3}"
      --rounds "${POLLEN_ROUNDS:-5}" --out "$results/$name")
for setting in ${POLLEN_SET:-}; do
    args+=(--set "$setting")
done
if [[ "${POLLEN_RESUME:-0}" == 1 ]]; then
    [[ -n "${POLLEN_RUN:-}" ]] || { echo "docker/run.sh: POLLEN_RESUME=1 needs POLLEN_RUN, the run to continue" >&2; exit 2; }
    args+=(--resume)
fi
exec pollen "${args[@]}" "$@"
