#!/usr/bin/env bash
# A flame graph of the client under scenario 5 (64 tasks locking and
# unlocking distinct resources): runs the benchmark's `--profile-seconds`
# loop on one subject, samples that process alone (not the redis-server
# nodes) with `perf record -F 999 --call-graph dwarf` for SECONDS, and folds
# the stacks with inferno into docs/profile-scenario5.svg, with the folded
# stacks and a summary of the top frames beside it (docs/profile-scenario5.txt).
#
#   scripts/profile.sh [ours|rslock|floor|guard]   # ours by default; guard: ours with the restart guard
#
# Needs `perf` (Debian: apt-get install linux-perf) and inferno
# (cargo install --locked inferno). perf_event_paranoid 2 suffices: the
# process is ours and only user-space stacks are wanted (-e cpu-clock:u
# falls back when hardware counters are not exposed, as in most VMs).
set -euo pipefail
cd "$(dirname "$0")/.."
subject="${1:-ours}"
SECONDS_SAMPLED="${SECONDS_SAMPLED:-8}"
out="${OUT:-docs/profile-scenario5}"
[ "$subject" = ours ] || out="$out-$subject"

command -v perf >/dev/null || { echo "profile: perf is missing (apt-get install linux-perf)" >&2; exit 2; }
command -v inferno-collapse-perf >/dev/null || { echo "profile: inferno is missing (cargo install --locked inferno)" >&2; exit 2; }
scripts/ensure-redis.sh

bin="$(cargo bench --locked -p redlock-bench --bench redlock --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "redlock" and m.get("executable"):
        print(m["executable"])')"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The loop runs a little longer than the sampling, which starts once the
# nodes are up and the connections warm.
"$bin" --profile-seconds "$((SECONDS_SAMPLED + 4))" --profile-subject "$subject" >"$tmp/loop.log" 2>&1 &
loop=$!
for _ in $(seq 1 100); do
  grep -q '^profiling loop' "$tmp/loop.log" && break
  sleep 0.1
done
sleep 1
perf record -q -F 999 --call-graph dwarf,16384 -e cpu-clock:u -p "$loop" -o "$tmp/perf.data" -- sleep "$SECONDS_SAMPLED" >/dev/null 2>&1
wait "$loop"
cat "$tmp/loop.log"

perf script -i "$tmp/perf.data" 2>/dev/null | inferno-collapse-perf >"$tmp/folded"
# KEEP_FOLDED=1 keeps the folded stacks beside the graph, to compare runs.
[ -z "${KEEP_FOLDED:-}" ] || cp "$tmp/folded" "$out.folded"
inferno-flamegraph --title "redlock bench, scenario 5 loop ($subject, $SECONDS_SAMPLED s, 999 Hz, user stacks)" \
  <"$tmp/folded" >"$out.svg"

# The summary: where the samples are, by the frame on top (self) and by any
# frame of the stack (total), the first 40 of each.
python3 - "$tmp/folded" "$(grep -E 'cycles/s' "$tmp/loop.log")" >"$out.txt" <<'EOF'
import collections, re, sys
self_, total, n = collections.Counter(), collections.Counter(), 0
ours, callers = collections.Counter(), collections.defaultdict(collections.Counter)
def short(f):
    f = re.sub(r"::h[0-9a-f]{16}$", "", f)
    return f[:150]
for line in open(sys.argv[1]):
    stack, count = line.rstrip().rsplit(" ", 1)
    count = int(count)
    frames = [short(f) for f in stack.split(";")]
    n += count
    self_[frames[-1]] += count
    for f in set(frames):
        total[f] += count
        if f.startswith("redlock_quorum::") or f.startswith("<redlock_quorum::"):
            ours[f] += count
    # the nearest caller that is not the allocator or libc
    caller = next((f for f in reversed(frames[:-1]) if not re.match(r"(_int_|__GI_|__memcpy|__rustc|alloc::|core::ptr|malloc|tcache|unlink_chunk|\[unknown\])", f)), "?")
    callers[frames[-1]][caller] += count
print(f"Scenario 5's loop, sampled by perf at 999 Hz (user stacks, dwarf unwinding); {n / 1e9:.2f} s of client CPU sampled.")
print(f"Loop: {sys.argv[2]}")
print("\nTop frames by self samples (the function on top of the stack):")
for f, c in self_.most_common(40):
    print(f"{100 * c / n:6.2f}%  {f}")
    if c * 100 >= n:
        for caller, cc in callers[f].most_common(3):
            print(f"           {100 * cc / n:5.2f}% from {caller}")
print("\nThis crate's frames by total samples (anywhere in the stack):")
for f, c in ours.most_common(40):
    print(f"{100 * c / n:6.2f}%  {f}")
print("\nTop frames by total samples (anywhere in the stack):")
for f, c in total.most_common(25):
    print(f"{100 * c / n:6.2f}%  {f}")
EOF
echo "wrote $out.svg and $out.txt" >&2
