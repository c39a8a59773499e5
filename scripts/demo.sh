#!/usr/bin/env bash
# The demo on a fresh machine: installs redis-server when it is missing (the
# demo then starts five nodes itself), or with REDLOCK_COMPOSE=1 starts the
# five-node cluster with Docker Compose and runs against it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${REDLOCK_COMPOSE:-0}" = 1 ]; then
  docker compose -f docker-compose.redlock.yml up -d --wait
  REDLOCK_NODES="$(scripts/cluster.sh nodes)"
  export REDLOCK_NODES
elif [ -z "${REDLOCK_NODES:-}" ]; then
  scripts/ensure-redis.sh
fi
# The demo's own crate (demo/): it compiles the library and the test harness,
# none of the benchmark's or the tests' dependencies.
exec cargo run --release --locked -p redlock-demo
