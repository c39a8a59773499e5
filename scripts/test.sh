#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs redis-server when it is
# missing, then runs every test against real redis-server processes that the
# harness starts on free loopback ports. With REDLOCK_COMPOSE=1 the tests that
# inject no fault run against the Docker Compose cluster instead (the fault
# tests still start their own servers, so redis-server is needed either way).
# Every feature is on (the CLI and TLS tests need theirs). Extra arguments
# go to `cargo test`.
#
# Every test binary and the doctests run, whatever fails first
# (`--no-fail-fast`). The run ends with a summary: the targets (test binaries
# and doctests) that passed, those that failed (with the failing tests), and
# those that did not run (a binary that crashed or never started, doctests
# that a build error kept from running). The exit status is 0 only when every
# expected target ran and passed. The full output is also kept in
# target/test-suite.log.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
if [ "${REDLOCK_COMPOSE:-0}" = 1 ]; then
  docker compose -f docker-compose.redlock.yml up -d --wait
  REDLOCK_NODES="$(scripts/cluster.sh nodes)"
  export REDLOCK_NODES
fi

mkdir -p target
log=target/test-suite.log
expected=target/test-suite.expected

# The targets that should run: every test executable cargo builds, and the
# doctests of every library among them (a library's unit-test binary is
# `deps/<crate>-<hash>`, its doctests "Doc-tests <crate>").
build_status=0
cargo test --workspace --all-features --no-run "$@" 2>&1 | tee "$log.build" || build_status=$?
sed -n 's/^ *Executable \(.*\) (\(.*\))$/\1 (\2)/p' "$log.build" |
  sed 's#(target/[^/]*/deps/\([^ ]*\)-[0-9a-f]*)#(\1)#' >"$expected.bins" || true
sed -n 's#^ *Executable unittests src/lib.rs (target/[^/]*/deps/\([^ ]*\)-[0-9a-f]*)$#Doc-tests \1#p' \
  "$log.build" >"$expected.docs" || true
cat "$expected.bins" "$expected.docs" >"$expected"

status=0
cargo test --workspace --all-features --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?

# Each target's outcome: "Running <target> (<binary>)" or "Doc-tests <crate>"
# opens it, "test result: ok|FAILED" closes it; a target opened and never
# closed crashed or hung up. Failing tests are listed under their target.
awk -v expected="$expected" '
  function close_target() {
    if (cur != "" && !(cur in outcome)) outcome[cur] = "crashed (no test result)"
  }
  BEGIN { while ((getline line < expected) > 0) { want[++n] = line } }
  /^ *Running / {
    close_target()
    t = $0; sub(/^ *Running /, "", t)
    if (match(t, /\(target\/[^\/]*\/deps\/[^ ]*-[0-9a-f]*\)$/)) {
      bin = substr(t, RSTART, RLENGTH); sub(/-[0-9a-f]*\)$/, ")", bin)
      sub(/\(target\/[^\/]*\/deps\//, "(", bin)
      t = substr(t, 1, RSTART - 1) bin
    }
    cur = t; if (!(cur in seen)) order[++k] = cur; seen[cur] = 1; next
  }
  /^ *Doc-tests / {
    close_target(); cur = $0; sub(/^ */, "", cur)
    if (!(cur in seen)) order[++k] = cur; seen[cur] = 1; next
  }
  /^test .* \.\.\. FAILED$/ && cur != "" {
    name = $0; sub(/^test /, "", name); sub(/ \.\.\. FAILED$/, "", name)
    failed_tests[cur] = failed_tests[cur] "\n      " name; next
  }
  /^test result: ok\./ && cur != "" { outcome[cur] = "ok"; cur = ""; next }
  /^test result: FAILED\./ && cur != "" { outcome[cur] = "FAILED"; cur = ""; next }
  END {
    close_target()
    for (t in seen) if (!(t in outcome)) outcome[t] = "crashed (no test result)"
    for (i = 1; i <= n; i++) if (!(want[i] in seen)) missing[++m] = want[i]
    print ""
    print "== test summary"
    passed = 0; bad = 0
    for (i = 1; i <= k; i++) if (outcome[order[i]] == "ok") passed++
    printf "passed: %d target(s)\n", passed
    for (i = 1; i <= k; i++) {
      t = order[i]
      if (outcome[t] != "ok") {
        bad++
        printf "FAILED: %s: %s%s\n", t, outcome[t], failed_tests[t]
      }
    }
    for (i = 1; i <= m; i++) printf "DID NOT RUN: %s\n", missing[i]
    if (bad == 0 && m == 0) print "every expected target ran and passed"
    else printf "%d target(s) failed, %d did not run\n", bad, m
    exit (bad > 0 || m > 0) ? 1 : 0
  }
' "$log" || status=1
if [ "$build_status" != 0 ] && [ "$status" = 0 ]; then status=$build_status; fi
exit "$status"
