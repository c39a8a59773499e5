#!/usr/bin/env bash
# The benchmark guard (issue 23, item 5): runs the benchmark's scenarios 1
# and 5 at their full sizes (`--only 1,5 --no-docs`: 1,000 acquisitions
# each, 15 interleaved 300 ms throughput slices per subject; about 20 s a
# run after the build) RUNS times, reads each run's
# target/bench/redlock.json, and fails when the median over the runs of a
# ratio measured side by side in one run crosses its threshold:
#
#   ours' healthy acquire p50 / the floor's     (scenario 1)  > MAX_ACQUIRE_P50
#   ours' lock+unlock throughput / the floor's  (scenario 5)  < MIN_THROUGHPUT
#
# The floor is raw SET NX PX to the same five nodes with plain redis-rs, in
# the same process, interleaved with ours, so the machine's load hits both
# alike; the median of three runs keeps one unlucky run from failing CI.
# Prints each run's ratios, their medians and the margin to each threshold.
# Extra arguments go to the benchmark binary. Needs redis-server (installed
# by scripts/ensure-redis.sh) and python3.
#
# Thresholds, overridable from the environment:
# - MAX_ACQUIRE_P50=1.3: the issue's figure. Beside four CPU burners the
#   medians measure 1.07-1.11x.
# - MIN_THROUGHPUT=0.8: the issue's figure. After the third pass on the hot
#   path, five guard runs beside four CPU burners (load 5.9-6.2) gave
#   medians of 0.97-0.99x (single runs 0.91-1.04x); before it, loaded
#   medians were 0.67-0.85x and the threshold was 0.6 (docs/performance.md,
#   "The benchmark guard").
# - RUNS=3: runs whose median is compared.
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_ACQUIRE_P50="${MAX_ACQUIRE_P50:-1.3}"
MIN_THROUGHPUT="${MIN_THROUGHPUT:-0.8}"
RUNS="${RUNS:-3}"

scripts/ensure-redis.sh
command -v python3 >/dev/null 2>&1 || {
  echo "bench-guard: python3 is needed to read the benchmark's JSON" >&2
  exit 2
}

out=target/bench/guard
mkdir -p "$out"
rm -f "$out"/run-*.json
cargo bench --locked -p redlock-bench --bench redlock --no-run >&2
for i in $(seq 1 "$RUNS"); do
  echo "bench-guard: run $i of $RUNS" >&2
  cargo bench --locked -q -p redlock-bench --bench redlock -- \
    --only 1,5 --no-docs "$@" >"$out/run-$i.log" 2>&1 || {
    cat "$out/run-$i.log" >&2
    echo "bench-guard: the benchmark failed (run $i)" >&2
    exit 2
  }
  cp target/bench/redlock.json "$out/run-$i.json"
done

python3 - "$MAX_ACQUIRE_P50" "$MIN_THROUGHPUT" "$out"/run-*.json <<'EOF'
import json, statistics, sys

max_acq, min_tp = float(sys.argv[1]), float(sys.argv[2])
ours, floor = "redlock-quorum", "floor"
acq, tp = [], []
for path in sys.argv[3:]:
    rows = json.load(open(path))["rows"]
    def get(scenario, subject, field):
        for r in rows:
            if r.get("scenario") == scenario and r.get("subject") == subject:
                return r[field]
        sys.exit(f"bench-guard: {path} has no scenario {scenario} row for {subject}")
    a = get(1, ours, "acquire_p50_ms") / get(1, floor, "acquire_p50_ms")
    t = get(5, ours, "cycles_per_s") / get(5, floor, "cycles_per_s")
    acq.append(a)
    tp.append(t)
    print(f"  {path}: acquire p50 / floor {a:.2f}x, throughput / floor {t:.2f}x")
a, t = statistics.median(acq), statistics.median(tp)
print(f"median of {len(acq)}: acquire p50 / floor {a:.2f}x (threshold <= {max_acq}, margin {max_acq - a:+.2f}); "
      f"throughput / floor {t:.2f}x (threshold >= {min_tp}, margin {t - min_tp:+.2f})")
failed = []
if a > max_acq:
    failed.append(f"acquire p50 / floor {a:.2f}x > {max_acq}")
if t < min_tp:
    failed.append(f"throughput / floor {t:.2f}x < {min_tp}")
if failed:
    print("bench-guard: FAILED: " + "; ".join(failed), file=sys.stderr)
    sys.exit(1)
print("bench-guard: passed")
EOF
