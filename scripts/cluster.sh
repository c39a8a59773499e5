#!/usr/bin/env bash
# The five-node Redlock cluster without Docker: the same nodes as
# docker-compose.redlock.yml (ports read from that file), with the same
# settings (cluster/redis-node.conf), as local redis-server processes.
#
#   scripts/cluster.sh up       start the nodes that are not running
#   scripts/cluster.sh down     stop them
#   scripts/cluster.sh status   one line per node
#   scripts/cluster.sh ports    the ports, one per line
#   scripts/cluster.sh nodes    the REDLOCK_NODES value for this cluster
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
compose="$root/docker-compose.redlock.yml"
conf="$root/cluster/redis-node.conf"
data="${REDLOCK_CLUSTER_DIR:-$root/target/redlock-cluster}"

ports() {
  # every "127.0.0.1:HOST:CONTAINER" mapping in the compose file
  grep -oE '"127\.0\.0\.1:[0-9]+:[0-9]+"' "$compose" | cut -d: -f2
}

pidfile() { echo "$data/$1/redis.pid"; }

running() {
  local pf
  pf="$(pidfile "$1")"
  [ -f "$pf" ] && kill -0 "$(cat "$pf")" 2>/dev/null
}

answers() { redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; }

up() {
  "$root/scripts/ensure-redis.sh"
  for p in $(ports); do
    if running "$p"; then echo "node $p: already running"; continue; fi
    mkdir -p "$data/$p"
    redis-server "$conf" --port "$p" --bind 127.0.0.1 --dir "$data/$p" \
      --daemonize yes --pidfile "$(pidfile "$p")" --logfile "$data/$p/redis.log"
  done
  for p in $(ports); do
    for _ in $(seq 1 100); do answers "$p" && break; sleep 0.05; done
    answers "$p" || { echo "node $p did not come up; see $data/$p/redis.log" >&2; exit 1; }
  done
  status
}

down() {
  for p in $(ports); do
    if running "$p"; then
      kill "$(cat "$(pidfile "$p")")" && echo "node $p: stopped"
    fi
  done
}

status() {
  for p in $(ports); do
    if answers "$p"; then echo "node $p: up"; else echo "node $p: down"; fi
  done
}

nodes() {
  local out=""
  for p in $(ports); do out="${out:+$out,}redis://127.0.0.1:$p/"; done
  echo "$out"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  ports) ports ;;
  nodes) nodes ;;
  *) echo "usage: $0 up|down|status|ports|nodes" >&2; exit 2 ;;
esac
