#!/usr/bin/env bash
# Start a local crowdmix cluster on loopback (Redis with AOF, two shufflers, one
# aggregator, generated registry and token) and keep it up until Ctrl-C/SIGTERM.
# Usage: deploy/launch.sh [DIR] [more `crowdmix cluster` flags]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir=${1:-"$root/crowdmix-out/cluster"}
shift || true
exec "$root/scripts/crowdmix" cluster --dir "$dir" "$@"
