#!/usr/bin/env bash
# What the release's waiting gate costs a node (docs/performance.md, "The
# tenth pass"): each variant here sets, then releases, one random key per
# call; redis-benchmark runs it 300,000 times (32 pipelined, 4 clients), and
# the node's INFO commandstats gives microseconds per call.
# Usage: benches/gate/run.sh [PORT] [ROUNDS]; starts its own redis-server on
# PORT (default 7291) and stops it afterwards.
set -euo pipefail
cd "$(dirname "$0")"
port=${1:-7291}; rounds=${2:-3}
redis-server --port "$port" --save '' --appendonly no --daemonize yes --logfile /dev/null
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
sleep 0.3
for round in $(seq 1 "$rounds"); do
  for f in *.lua; do
    sha=$(redis-cli -p "$port" script load "$(cat "$f")")
    case $f in
      3-*) args=(2 'bench:gate:__rand_int__' 'bench:gate:__rand_int__:w' 0123456789abcdef0123456789abcdef0123abcd) ;;
      *) args=(1 'bench:gate:__rand_int__' 0123456789abcdef0123456789abcdef0123abcd) ;;
    esac
    redis-cli -p "$port" config resetstat >/dev/null
    redis-benchmark -p "$port" -r 100000000 -n 300000 -P 32 -c 4 -q evalsha "$sha" "${args[@]}" >/dev/null
    us=$(redis-cli -p "$port" info commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
    printf '%-28s %s us/call\n' "${f%.lua}" "$us"
  done
done
