#!/usr/bin/env bash
# The compose `certs` service: every credential of the federation is made once in ALL (a volume
# only this service mounts) by scripts/generate-certs.sh, then each service gets a copy of just
# what it needs, in its own directory (a volume only that service mounts):
#   superlink   ca.crt server.pem server.key superexec.secret supernodes/*.pub (allow-list)
#   serverapp   ca.crt superexec.secret                  (the SuperExec running the ServerApp)
#   supernode   ca.crt signing.pub supernodes/*.key supernodes/*.pub
#                                                        (node keys; the operator's public key;
#                                                        the registered nodes' public keys)
#   run         ca.crt signing.key                       (signs the app it submits)
# Files already made are kept (re-running changes nothing that was handed out).
# Usage: docker/credentials.sh ALL SUPERLINK SERVERAPP SUPERNODE RUN NUM_NODES [HOST_OR_IP ...]
#   (ALL: every credential; the next four: each service's share)
set -euo pipefail
all="${1:?usage: credentials.sh ALL SUPERLINK SERVERAPP SUPERNODE RUN NUM_NODES [HOSTS ...]}"
declare -A out=([superlink]="${2:?}" [serverapp]="${3:?}" [supernode]="${4:?}" [run]="${5:?}")
nodes="${6:?number of SuperNodes}"
shift 6
"$(dirname "$0")/../scripts/generate-certs.sh" "$all" --nodes "$nodes" "$@"
give() {  # SERVICE FILE... : copy into OUT/SERVICE, keeping relative paths and permissions
    local service=$1 file
    shift
    for file in "$@"; do
        mkdir -p "${out[$service]}/$(dirname "$file")"
        cp -p "$all/$file" "${out[$service]}/$file"
    done
}
pubs=() keys=()
for ((i = 0; i < nodes; i++)); do
    pubs+=("supernodes/node-$i.pub")
    keys+=("supernodes/node-$i.key")
done
give superlink ca.crt server.pem server.key superexec.secret "${pubs[@]}"
give serverapp ca.crt superexec.secret
give supernode ca.crt signing.pub "${keys[@]}" "${pubs[@]}"
give run ca.crt signing.key
echo "credentials handed out to superlink, serverapp, supernode and run"
