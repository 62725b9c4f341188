#!/usr/bin/env bash
# A tokens file with one random bearer token, for the compose files (mounted as
# /etc/crowdmix/tokens.txt). The shuffler refuses the placeholder of tokens.example.txt.
# Usage: deploy/make-token.sh [FILE] [APP]   (default: deploy/tokens.txt example-app)
set -euo pipefail
file=${1:-"$(cd "$(dirname "$0")" && pwd)/tokens.txt"}
app=${2:-example-app}
umask 077
token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
printf '%s %s\n' "$app" "$token" > "$file"
# readable by the containers' user (uid/gid 65534, deploy/Dockerfile), as make-certs.sh does
if chgrp 65534 "$file" 2>/dev/null; then chmod 640 "$file"; else chmod 644 "$file"; fi
echo "wrote $file (token for $app: send 'authorization: Bearer $token')"
