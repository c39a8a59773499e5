#!/usr/bin/env bash
# The fault suite at volume: scripts/soak.sh DURATION
#
# Runs every fault workload of the harness's fault runner (fault::run: eight
# contenders, two of them separate processes, on one resource of a
# five-node cluster, judged by the checker on one monotonic clock) for
# DURATION each, all at once, and prints one report: per fault type, the
# acquisitions, the faults injected, the violations (overlapping validity
# windows, interleaved critical sections of two valid holders, stale writes
# accepted past fencing), the overruns (a holder descheduled past its
# validity while it worked: the documented limit of a lease, counted but not
# a failure), and the keys left on the nodes at the end; then the totals.
#
# DURATION is seconds, or a number with s, m or h (900, 15m, 1h). The fault
# types: a paused minority, a killed minority restarted after the largest
# ttl, moving partitions, latency spikes with short ttls, lost replies,
# script flushes with node restarts under renewing guards, and immediate
# restarts without persistence under the restart guard.
#
# SOAK_JOBS (default: all seven at once) runs fewer at a time; each then
# gets DURATION divided by the number of rounds, so the soak still takes
# about DURATION. The tests are built optimised in target/soak (a few
# minutes the first time; SOAK_PROFILE=dev takes the debug build instead).
# Output of every test goes to target/soak.log.
#
# Exits non-zero when any fault type found a violation, leaked a key or
# failed any other check of fault::settle.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/soak.sh DURATION   (seconds, or 30s, 15m, 1h)" >&2; exit 2; }
[ $# -eq 1 ] || usage
case "$1" in
  *h) secs=$(( ${1%h} * 3600 )) ;;
  *m) secs=$(( ${1%m} * 60 )) ;;
  *s) secs=${1%s} ;;
  *) secs=$1 ;;
esac
[[ "$secs" =~ ^[0-9]+$ ]] && [ "$secs" -gt 0 ] || usage

# test binary, test name
workloads=(
  "faults minority_paused_and_resumed_repeatedly"
  "faults minority_killed_and_restarted_after_the_largest_ttl"
  "faults partitions_move_between_minorities_then_heal"
  "faults latency_spikes_on_a_minority_with_short_ttls"
  "faults a_set_whose_reply_is_lost_is_cleaned_up_by_the_failure_path"
  "faults script_flush_and_a_node_restart_during_watchdog_holds"
  "restart_guard under_contention_an_immediate_restart_without_persistence_lets_no_one_in_twice"
)
jobs=${SOAK_JOBS:-${#workloads[@]}}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "SOAK_JOBS must be a positive number" >&2; exit 2; }
rounds=$(( (${#workloads[@]} + jobs - 1) / jobs ))
per=$(( secs / rounds ))
[ "$per" -ge 1 ] || per=1

scripts/ensure-redis.sh
# An optimised build in a target directory of its own (the first build takes
# a few minutes): the workload is CPU-bound, and a debug build gets a
# fraction of the acquisitions. SOAK_PROFILE=dev uses the debug build in
# target/ instead.
profile=${SOAK_PROFILE:-release}
if [ "$profile" = release ]; then
  export CARGO_TARGET_DIR=target/soak
  cargo test --release --all-features --test faults --test restart_guard --no-run 2>&1 | tail -3
  deps=target/soak/release/deps
else
  cargo test --all-features --test faults --test restart_guard --no-run 2>&1 | tail -3
  deps=target/debug/deps
fi
bin() { # the newest test executable of that name
  ls -t "$deps/$1"-* 2>/dev/null | grep -v '\.d$' | head -1
}

log=target/soak.log
: >"$log"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "soak: ${#workloads[@]} fault workloads, $jobs at a time, ${per}s each (about ${secs}s in all); output in $log" >&2
start=$(date +%s)
i=0
pids=()
for w in "${workloads[@]}"; do
  set -- $w
  exe=$(bin "$1")
  [ -n "$exe" ] || { echo "no test binary for $1" >&2; exit 1; }
  REDLOCK_FAULT_SECS=$per "$exe" --exact "$2" --nocapture --test-threads=1 \
    >"$dir/$i.out" 2>&1 &
  pids+=($!)
  i=$((i + 1))
  if [ "${#pids[@]}" -ge "$jobs" ]; then
    for p in "${pids[@]}"; do wait "$p" || true; done
    pids=()
  fi
done
for p in "${pids[@]}"; do wait "$p" || true; done
elapsed=$(( $(date +%s) - start ))

failed=0
for j in $(seq 0 $((i - 1))); do
  cat "$dir/$j.out" >>"$log"
  if ! grep -q '^test result: ok\. 1 passed' "$dir/$j.out"; then
    failed=$((failed + 1))
    set -- ${workloads[$j]}
    echo "FAILED: $1 $2:" >&2
    grep -A1 "panicked" "$dir/$j.out" | head -4 >&2 || true
  fi
done

# one report from the summary lines of fault::settle
grep -ho 'fault [^:]*: acquisitions [0-9]* (floor.*' "$log" | awk -v elapsed="$elapsed" -v failed="$failed" '
  function num(key,   r) {
    if (match($0, key " [0-9]+")) { r = substr($0, RSTART, RLENGTH); sub(/.* /, "", r); return r + 0 }
    return 0
  }
  {
    name = $0; sub(/^fault /, "", name); sub(/: acquisitions.*/, "", name)
    a = num("acquisitions"); f = num("faults injected"); v = num("violations")
    o = num("overruns"); oi = num("\\(interleaved"); e = num("expired before entry")
    k = num("keys leaked"); u = num("unlock errors")
    printf "%-60s %12d %7d %10d %9d %11d %13d %6d\n", name, a, f, v, o, oi, e, k
    A += a; F += f; V += v; O += o; OI += oi; E += e; K += k
  }
  BEGIN {
    printf "\n== soak report (%d s)\n", elapsed
    printf "%-60s %12s %7s %10s %9s %11s %13s %6s\n", "fault type", "acquisitions", "faults", "violations", "overruns", "interleaved", "expired-entry", "leaked"
  }
  END {
    printf "%-60s %12d %7d %10d %9d %11d %13d %6d\n", "total", A, F, V, O, OI, E, K
    print ""
    print "violations: overlapping validity windows, interleaved critical sections of two valid holders, stale writes accepted past fencing (any is a failure)"
    print "overruns: critical sections not entirely inside their holder'"'"'s validity (descheduled holders; interleaved: another holder entered meanwhile), the documented limit"
    print "expired-entry: grants whose validity was gone before the holder could enter (it did not enter)"
    print "leaked: keys left on the nodes after the run"
    printf "%d of the fault workloads failed a check\n", failed
  }'
[ "$failed" = 0 ]
