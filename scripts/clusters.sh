#!/usr/bin/env bash
# Five Redis Clusters of three masters each, for Redlock over clusters
# (nodes named by redis+cluster:// URLs), without Docker: the same clusters
# as docker-compose.redlock-clusters.yml (ports read from that file, three
# consecutive ones per cluster), with the same settings (cluster/redis-node.conf
# plus cluster mode), as local redis-server processes. A cluster is formed
# with plain CLUSTER commands (MEET, ADDSLOTS), as the test harness forms its
# own (harness/src/shards.rs), so that Redis 6.2, 7.x and Valkey all work.
#
#   scripts/clusters.sh up       start the nodes that are not running, and form
#                                the clusters that are not formed yet
#   scripts/clusters.sh down     stop them; their cluster config and data stay
#                                under target/redlock-clusters, so `up` brings
#                                the same clusters back
#   scripts/clusters.sh status   one line per cluster
#   scripts/clusters.sh urls     the REDLOCK_NODES value: the five
#                                redis+cluster:// URLs separated by ';' (each
#                                URL lists its masters separated by commas)
#
#   REDLOCK_NODES="$(scripts/clusters.sh urls)" cargo test --features cluster ...
#
# Start afresh with: scripts/clusters.sh down && rm -rf target/redlock-clusters
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
compose="$root/docker-compose.redlock-clusters.yml"
conf="$root/cluster/redis-node.conf"
data="${REDLOCK_CLUSTERS_DIR:-$root/target/redlock-clusters}"
server="${REDIS_SERVER:-redis-server}"
masters=3
slots=16384

ports() {
  # every "127.0.0.1:HOST:CONTAINER" mapping in the compose file
  grep -oE '"127\.0\.0\.1:[0-9]+:[0-9]+"' "$compose" | cut -d: -f2
}

# One line per cluster: its masters' ports.
clusters() {
  local n
  n="$(ports | wc -l)"
  if [ "$n" -eq 0 ] || [ $((n % masters)) -ne 0 ]; then
    echo "error: $compose maps $n ports, not a multiple of $masters" >&2
    exit 1
  fi
  ports | xargs -n "$masters"
}

pidfile() { echo "$data/$1/redis.pid"; }

running() {
  local pf
  pf="$(pidfile "$1")"
  [ -f "$pf" ] && kill -0 "$(cat "$pf")" 2>/dev/null
}

cli() { local p="$1"; shift; redis-cli -h 127.0.0.1 -p "$p" "$@"; }

answers() { cli "$1" ping 2>/dev/null | grep -q PONG; }

# A field of CLUSTER INFO on one node (empty when it does not answer).
cluster_field() { cli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"; }

start_node() {
  local p="$1"
  mkdir -p "$data/$p"
  # The cluster bus listens on the port + 10000.
  "$server" "$conf" --port "$p" --bind 127.0.0.1 --dir "$data/$p" \
    --daemonize yes --pidfile "$(pidfile "$p")" --logfile "$data/$p/redis.log" \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
  for _ in $(seq 1 100); do answers "$p" && return 0; sleep 0.05; done
  echo "node $p did not come up; see $data/$p/redis.log" >&2
  return 1
}

# Whether every node of the cluster says cluster_state:ok.
cluster_ok() {
  local p
  for p in "$@"; do [ "$(cluster_field "$p" cluster_state)" = ok ] || return 1; done
}

# Forms the cluster of the given ports unless it is formed, or on its way:
# distinct config epochs, every node meets the first, contiguous slot ranges.
form() {
  local first="$1" count="$#" i=0 p start end
  for p in "$@"; do
    [ "$(cluster_field "$p" cluster_known_nodes)" = 1 ] || return 0
    [ "$(cluster_field "$p" cluster_slots_assigned)" = 0 ] || return 0
  done
  for p in "$@"; do
    i=$((i + 1))
    cli "$p" cluster set-config-epoch "$i" >/dev/null
    [ "$p" = "$first" ] || cli "$p" cluster meet 127.0.0.1 "$first" >/dev/null
  done
  i=0
  for p in "$@"; do
    start=$((i * slots / count)); end=$(((i + 1) * slots / count - 1))
    # shellcheck disable=SC2046
    cli "$p" cluster addslots $(seq "$start" "$end") >/dev/null
    i=$((i + 1))
  done
}

# Waits (30 s at most) until every node of the cluster says cluster_state:ok.
wait_ok() {
  for _ in $(seq 1 300); do
    cluster_ok "$@" && { echo "cluster $*: ok"; return 0; }
    sleep 0.1
  done
  echo "cluster $* did not reach cluster_state:ok in 30 s; see $data/<port>/redis.log," >&2
  echo "or start afresh: $0 down && rm -rf $data && $0 up" >&2
  return 1
}

up() {
  REDIS_SERVER="$server" "$root/scripts/ensure-redis.sh"
  command -v redis-cli >/dev/null 2>&1 || { echo "error: redis-cli is missing" >&2; exit 1; }
  local c p
  # Every process first, then every cluster formed, then the waits: a
  # master turns ok no sooner than 2 s after it started, and later than that
  # only after the node timeout (5 s) since it last saw itself alone; formed
  # together, the clusters make the first 2 s.
  for p in $(ports); do
    if running "$p"; then echo "node $p: already running"; continue; fi
    start_node "$p" || exit 1
  done
  while read -r c; do
    # shellcheck disable=SC2086
    form $c
  done < <(clusters)
  while read -r c; do
    # shellcheck disable=SC2086
    wait_ok $c || exit 1
  done < <(clusters)
}

down() {
  local p
  for p in $(ports); do
    if running "$p"; then
      kill "$(cat "$(pidfile "$p")")" && echo "node $p: stopped"
    fi
  done
}

status() {
  local c p state down
  while read -r c; do
    down=""
    # shellcheck disable=SC2086
    for p in $c; do answers "$p" || down="$down $p"; done
    if [ -n "$down" ]; then
      state="down (no answer from$down)"
    # shellcheck disable=SC2086
    elif cluster_ok $c; then
      state="ok"
    else
      state="not ok ($(for p in $c; do echo -n "$p:$(cluster_field "$p" cluster_state) "; done))"
    fi
    echo "cluster $c: $state"
  done < <(clusters)
}

urls() {
  local c p url out=""
  while read -r c; do
    url=""
    for p in $c; do url="${url:+$url,}127.0.0.1:$p"; done
    out="${out:+$out;}redis+cluster://$url"
  done < <(clusters)
  echo "$out"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  urls) urls ;;
  *)
    echo "usage: $0 up|down|status|urls" >&2
    echo "  urls prints REDLOCK_NODES: redis+cluster:// URLs separated by ';'" >&2
    echo "  (a URL's own seeds are separated by commas)" >&2
    exit 2
    ;;
esac
