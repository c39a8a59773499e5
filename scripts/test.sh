#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs redis-server when it is
# missing, then runs every test against real redis-server processes that the
# harness starts on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
cargo test "$@"
