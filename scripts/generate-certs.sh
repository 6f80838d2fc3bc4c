#!/usr/bin/env bash
# TLS certificates and SuperNode authentication keys.
# Usage: scripts/generate-certs.sh DIR [--nodes N] [HOST_OR_IP ...]
#   DIR/ca.crt, DIR/ca.key          the CA (ca.key stays on the machine that made it)
#   DIR/server.pem, DIR/server.key  the SuperLink's certificate, signed by the CA, valid for
#                                   localhost, 127.0.0.1 and every HOST_OR_IP given (the
#                                   SuperLink's address as SuperNodes see it)
#   DIR/supernodes/node-I.key/.pub  with --nodes N: one ECDSA key pair per SuperNode (I < N);
#                                   the .pub files are the SuperLink's allow-list
#   DIR/signing.key, DIR/signing.pub the operator's ed25519 app-signing key: `pollen run
#                                   --signing-key` signs each app; SuperNodes started with
#                                   `pollen client --trusted-key signing.pub` run nothing else
#   DIR/superexec.secret            the secret shared by the SuperLink and the SuperExec that
#                                   runs the ServerApp (`pollen server --isolation process`)
# Files that already exist are kept, so running it again (say with a larger --nodes) adds keys
# without invalidating certificates and keys already handed out. Give SuperNodes ca.crt and
# their own node-I.key only. Flower 1.39 authenticates SuperNodes by these signing keys, not
# by client certificates (its Fleet API has no mutual TLS).
set -euo pipefail
dir="${1:?usage: generate-certs.sh DIR [--nodes N] [HOST_OR_IP ...]}"
shift
nodes=0
hosts=()
while (($#)); do
    case "$1" in
        --nodes) nodes="${2:?--nodes needs a number}"; shift 2 ;;
        *) hosts+=("$1"); shift ;;
    esac
done
mkdir -p "$dir"
san="DNS:localhost,IP:127.0.0.1"
for host in "${hosts[@]+"${hosts[@]}"}"; do
    if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then san="$san,IP:$host"; else san="$san,DNS:$host"; fi
done
if [[ ! -f "$dir/ca.crt" ]]; then
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$dir/ca.key" -out "$dir/ca.crt" \
        -days 365 -subj "/CN=pollen-ca" 2>/dev/null
    chmod 600 "$dir/ca.key"
fi
if [[ ! -f "$dir/server.pem" ]]; then
    openssl req -newkey rsa:2048 -nodes -keyout "$dir/server.key" -out "$dir/server.csr" \
        -subj "/CN=pollen-superlink" 2>/dev/null
    printf "subjectAltName=%s\n" "$san" > "$dir/san.ext"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
        -CAcreateserial -out "$dir/server.pem" -days 365 -extfile "$dir/san.ext" 2>/dev/null
    rm -f "$dir/server.csr" "$dir/san.ext" "$dir/ca.srl"
    chmod 600 "$dir/server.key"
    echo "server certificate in $dir (valid for $san)"
else
    echo "kept the existing certificates in $dir"
fi
if [[ ! -f "$dir/signing.key" ]]; then
    ssh-keygen -q -t ed25519 -N "" -C "pollen-operator" -f "$dir/signing.key"
    mv -f "$dir/signing.key.pub" "$dir/signing.pub"
    echo "app-signing key in $dir/signing.key (give SuperNodes $dir/signing.pub)"
fi
if [[ ! -f "$dir/superexec.secret" ]]; then
    (umask 077 && openssl rand -hex 32 | tr -d '\n' > "$dir/superexec.secret")
fi
if ((nodes > 0)); then
    mkdir -p "$dir/supernodes"
    for ((i = 0; i < nodes; i++)); do
        key="$dir/supernodes/node-$i.key"
        [[ -f "$key" ]] || ssh-keygen -q -t ecdsa -b 384 -N "" -C "pollen-node-$i" -f "$key"
        mv -f "$key.pub" "$dir/supernodes/node-$i.pub" 2>/dev/null || true
    done
    echo "SuperNode keys in $dir/supernodes (allow-list: the .pub files)"
fi
# readable inside containers that run as another user; keys stay private to their owner
chmod 644 "$dir/ca.crt" "$dir/server.pem" "$dir/signing.pub"
chmod 600 "$dir/signing.key" "$dir/superexec.secret"
