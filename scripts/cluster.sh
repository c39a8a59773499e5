#!/usr/bin/env bash
# The five-node Redlock cluster without Docker: the same nodes as
# docker-compose.redlock.yml (ports read from that file), with the same
# settings (cluster/redis-node.conf), as local redis-server processes.
#
#   scripts/cluster.sh up       start the nodes that are not running
#   scripts/cluster.sh down     stop them
#   scripts/cluster.sh status   one line per node
#   scripts/cluster.sh restart PORT [DELAY_S]
#                               stop one node, wait DELAY_S seconds (set it
#                               above your largest lock ttl when the node runs
#                               without fsync-always persistence), start it
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
    start_node "$p" || exit 1
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

start_node() {
  local p="$1"
  mkdir -p "$data/$p"
  redis-server "$conf" --port "$p" --bind 127.0.0.1 --dir "$data/$p" \
    --daemonize yes --pidfile "$(pidfile "$p")" --logfile "$data/$p/redis.log"
  for _ in $(seq 1 100); do answers "$p" && return 0; sleep 0.05; done
  echo "node $p did not come up; see $data/$p/redis.log" >&2
  return 1
}

restart() {
  local p="${1:?usage: $0 restart PORT [DELAY_S]}" delay="${2:-0}"
  ports | grep -qx "$p" || { echo "no node on port $p in $compose" >&2; exit 2; }
  if running "$p"; then
    kill "$(cat "$(pidfile "$p")")"
    for _ in $(seq 1 100); do running "$p" || break; sleep 0.05; done
  fi
  if [ "$delay" != 0 ]; then
    echo "node $p: stopped; restarting in $delay s (a delayed restart: locks it held expire first)"
    sleep "$delay"
  fi
  start_node "$p" && echo "node $p: up"
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
  restart) shift; restart "$@" ;;
  ports) ports ;;
  nodes) nodes ;;
  *) echo "usage: $0 up|down|status|restart PORT [DELAY_S]|ports|nodes" >&2; exit 2 ;;
esac
