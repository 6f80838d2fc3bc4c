#!/usr/bin/env bash
# Starts one SuperNode of a scaled compose service (`deploy.replicas`, `--scale supernode=N`):
# takes a lease on a partition in STATE_DIR/claims, then runs `pollen client` with that
# partition, its own state directory and, if KEY_DIR is not empty, its key
# KEY_DIR/node-<partition>.key.
# A lease is the directory claims/<partition> (made with mkdir, which is atomic) holding the
# holder's hostname in `owner` and a `heartbeat` file touched every POLLEN_LEASE_BEAT seconds
# while the holder lives. A lease whose heartbeat is older than POLLEN_LEASE_EXPIRY seconds
# belongs to a dead holder (a container killed or removed without a clean stop) and is taken
# over (renamed away first, so that of two contenders only one wins). A restarted container
# keeps its lease (found by hostname); a clean exit releases it. When every partition is
# leased, it waits for one to expire or be released, at most POLLEN_LEASE_WAIT seconds.
# Usage: docker/supernode.sh STATE_DIR NUM_CLIENTS KEY_DIR [pollen client options ...]
set -euo pipefail
state="${1:?usage: supernode.sh STATE_DIR NUM_CLIENTS KEY_DIR [options]}"
clients="${2:?number of clients}"
keys="${3-}"
shift 3
beat="${POLLEN_LEASE_BEAT:-5}"
expiry="${POLLEN_LEASE_EXPIRY:-30}"
wait_max="${POLLEN_LEASE_WAIT:-300}"
me="${HOSTNAME:-$(hostname)}"
claims="$state/claims"
mkdir -p "$claims"

age() {  # seconds since the lease's heartbeat (or since the lease was made, if none yet)
    local file="$1/heartbeat" stamp
    [[ -e "$file" ]] || file="$1"
    stamp=$(stat -c %Y "$file" 2>/dev/null) || { echo 0; return; }
    echo $(($(date +%s) - stamp))
}

take() {  # a lease on partition $1, or failure
    local dir="$claims/$1"
    if mkdir "$dir" 2>/dev/null; then
        echo "$me" > "$dir/owner"
        touch "$dir/heartbeat"
        return 0
    fi
    if (($(age "$dir") > expiry)); then
        local old
        old="$claims/.expired-$1-$me-$$"
        if mv "$dir" "$old" 2>/dev/null; then
            echo "supernode.sh: partition $1's lease expired (holder $(cat "$old/owner" 2>/dev/null || echo unknown)); taking it over"
            rm -rf "$old"
            take "$1"
            return
        fi
    fi
    return 1
}

part=""
for ((i = 0; i < clients; i++)); do
    if [[ "$(cat "$claims/$i/owner" 2>/dev/null || true)" == "$me" ]]; then part=$i; break; fi
done
deadline=$(($(date +%s) + wait_max))
tries=0
while [[ -z "$part" ]]; do
    for ((i = 0; i < clients; i++)); do
        if take "$i"; then part=$i; break; fi
    done
    [[ -n "$part" ]] && break
    # give up only after one wait at least: `date +%s` counts whole seconds, so a short
    # POLLEN_LEASE_WAIT could otherwise pass before the first look
    if ((tries > 0 && $(date +%s) >= deadline)); then
        echo "supernode.sh: all $clients partitions are leased by live SuperNodes (leases in $claims; waited ${wait_max} s)" >&2
        exit 1
    fi
    echo "supernode.sh: all $clients partitions are leased; waiting for one to be released or to expire (${expiry} s without heartbeat)"
    tries=$((tries + 1))
    sleep "$beat"
done
lease="$claims/$part"
touch "$lease/heartbeat"
( while sleep "$beat"; do touch "$lease/heartbeat" 2>/dev/null || exit 0; done ) &
heart=$!
args=(client --partition-id "$part" --num-partitions "$clients" --state-dir "$state/client-$part")
# the node's key signs its secure-aggregation keys; the registered nodes' .pub are the only
# keys it takes from others (docs/security.md#threat-model)
if [[ -n "$keys" ]]; then args+=(--auth-key "$keys/node-$part.key" --peer-keys "$keys"); fi
echo "supernode.sh: $me serves partition $part of $clients"
pollen "${args[@]}" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true' TERM INT
status=0
wait "$child" || status=$?
if kill -0 "$child" 2>/dev/null; then wait "$child" || status=$?; fi
kill "$heart" 2>/dev/null || true
if [[ "$(cat "$lease/owner" 2>/dev/null || true)" == "$me" ]]; then rm -rf "$lease"; fi
exit "$status"
