#!/usr/bin/env bash
# Starts one SuperNode of a scaled compose service (`deploy.replicas`): claims the first free
# partition in STATE_DIR/claims (atomic mkdir; a restarted container keeps its claim, found by
# hostname), then runs `pollen client` with that partition, its own state directory and, if
# KEY_DIR is not empty, its key KEY_DIR/node-<partition>.key. The claim is released on exit.
# Usage: docker/supernode.sh STATE_DIR NUM_CLIENTS KEY_DIR [pollen client options ...]
set -euo pipefail
state="${1:?usage: supernode.sh STATE_DIR NUM_CLIENTS KEY_DIR [options]}"
clients="${2:?number of clients}"
keys="${3-}"
shift 3
me="${HOSTNAME:-$(hostname)}"
mkdir -p "$state/claims"
part=""
for ((i = 0; i < clients; i++)); do
    if [[ "$(cat "$state/claims/$i/owner" 2>/dev/null || true)" == "$me" ]]; then part=$i; break; fi
done
if [[ -z "$part" ]]; then
    for ((i = 0; i < clients; i++)); do
        if mkdir "$state/claims/$i" 2>/dev/null; then
            echo "$me" > "$state/claims/$i/owner"
            part=$i
            break
        fi
    done
fi
if [[ -z "$part" ]]; then
    echo "supernode.sh: all $clients partitions are taken (claims in $state/claims)" >&2
    exit 1
fi
args=(client --partition-id "$part" --num-partitions "$clients" --state-dir "$state/client-$part")
if [[ -n "$keys" ]]; then args+=(--auth-key "$keys/node-$part.key"); fi
echo "supernode.sh: $me serves partition $part of $clients"
pollen "${args[@]}" "$@" &
child=$!
release() { rm -rf "$state/claims/$part"; }
trap 'kill -TERM "$child" 2>/dev/null || true' TERM INT
status=0
wait "$child" || status=$?
if kill -0 "$child" 2>/dev/null; then wait "$child" || status=$?; fi
release
exit "$status"
