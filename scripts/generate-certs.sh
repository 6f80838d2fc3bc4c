#!/usr/bin/env bash
# Creates a CA and a SuperLink server certificate for TLS: DIR/ca.crt, DIR/server.pem,
# DIR/server.key. Usage: scripts/generate-certs.sh DIR [HOST_OR_IP ...]
# The certificate is valid for localhost, 127.0.0.1 and every extra host or IP given
# (the SuperLink's address as clients see it). Give clients DIR/ca.crt only.
set -euo pipefail
dir="${1:?usage: generate-certs.sh DIR [HOST_OR_IP ...]}"
shift
mkdir -p "$dir"
san="DNS:localhost,IP:127.0.0.1"
for host in "$@"; do
    if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then san="$san,IP:$host"; else san="$san,DNS:$host"; fi
done
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$dir/ca.key" -out "$dir/ca.crt" \
    -days 365 -subj "/CN=pollen-ca" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$dir/server.key" -out "$dir/server.csr" \
    -subj "/CN=pollen-superlink" 2>/dev/null
printf "subjectAltName=%s\n" "$san" > "$dir/san.ext"
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -out "$dir/server.pem" -days 365 -extfile "$dir/san.ext" 2>/dev/null
rm -f "$dir/server.csr" "$dir/san.ext" "$dir/ca.srl"
chmod 600 "$dir/ca.key" "$dir/server.key"
echo "certificates in $dir (valid for $san)"
