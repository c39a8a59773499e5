#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs redis-server when it is
# missing, then runs every test against real redis-server processes that the
# harness starts on free loopback ports. With REDLOCK_COMPOSE=1 the tests that
# inject no fault run against the Docker Compose cluster instead (the fault
# tests still start their own servers, so redis-server is needed either way).
# Every feature is on (the CLI and TLS tests need theirs). Extra arguments
# go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
if [ "${REDLOCK_COMPOSE:-0}" = 1 ]; then
  docker compose -f docker-compose.redlock.yml up -d --wait
  REDLOCK_NODES="$(scripts/cluster.sh nodes)"
  export REDLOCK_NODES
fi
cargo test --workspace --all-features "$@"
