#!/usr/bin/env bash
# Example TLS material for a local cluster: a private CA, a server certificate
# for the shuffler (devices -> shuffler, TLS), and server + client certificates
# for mTLS between shuffler and aggregator. For trials only: in production use
# your own PKI and keep the CA key offline.
# Usage: deploy/tls/make-certs.sh OUT_DIR [HOSTNAME...]   (default hosts: localhost 127.0.0.1)
set -euo pipefail
out=${1:?usage: make-certs.sh OUT_DIR [HOSTNAME...]}
shift
hosts=("${@:-localhost}")
[ $# -gt 0 ] || hosts=(localhost 127.0.0.1)
mkdir -p "$out"
cd "$out"

san=""
for h in "${hosts[@]}"; do
  if [[ $h =~ ^[0-9.]+$ ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
done
san=${san%,}

openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=crowdmix example CA" \
  -keyout ca.key -out ca.crt 2>/dev/null

issue() {  # name, extendedKeyUsage
  openssl req -newkey rsa:2048 -nodes -subj "/CN=crowdmix $1" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$san" "$2" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
issue shuffler serverAuth
issue aggregator serverAuth
issue shuffler-client clientAuth
rm -f ca.srl
# The CA key signs certificates and nothing else: owner-only, and compose.tls.yaml
# mounts single files, never this one, into the containers.
chmod 600 ca.key
# The containers run as uid/gid 65534 (deploy/Dockerfile): the service keys must be
# readable by that group. Without the right to chgrp (not root), they are made
# readable by all, as example material on a trial host; say so.
keys=(shuffler.key aggregator.key shuffler-client.key)
if chgrp 65534 "${keys[@]}" 2>/dev/null; then
  chmod 640 "${keys[@]}"
else
  chmod 644 "${keys[@]}"
  echo "note: could not chgrp the keys to 65534 (not root): made them readable by all" >&2
fi
chmod 644 ./*.crt
echo "wrote $(pwd): ca.crt, shuffler.{crt,key}, aggregator.{crt,key}, shuffler-client.{crt,key}" \
  "(ca.key: keep it, never mount it)"
