#!/usr/bin/env bash
# One command for a local Docker federation: build the image (once, for every service), start
# the federation, follow the run to its end and exit with the run's status (0: completed).
# The federation stays up afterwards, so running this again submits another run (a fresh
# results directory each time); `docker compose down` stops it. Arguments go to every
# `docker compose` call, e.g. `docker/up.sh -f docker-compose.yml -f docker-compose.insecure.yml`.
# Settings come from the environment (POLLEN_CLIENTS, POLLEN_ALGORITHM, ...; see the README).
set -euo pipefail
cd "$(dirname "$0")/.."
compose=(docker compose "$@")
"${compose[@]}" up --detach --build --remove-orphans
docker compose --ansi never "$@" logs --follow --no-log-prefix run &
follower=$!
status=0
"${compose[@]}" wait run >/dev/null || status=$?
wait "$follower" 2>/dev/null || true
if ((status == 0)); then
    echo "docker/up.sh: the run completed; results in the 'results' volume (docker compose down to stop the federation)"
else
    echo "docker/up.sh: the run failed (exit code $status); see docker compose logs" >&2
fi
exit "$status"
