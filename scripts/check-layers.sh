#!/usr/bin/env bash
# The layer rules of src/ (see ARCHITECTURE.md), checked with grep and awk:
#
# - src/protocol/ is pure: no import of crate::engine or crate::api, no
#   tokio, no redis connection types (redis::aio, MultiplexedConnection,
#   redis::Client);
# - src/engine/ never imports the face: no crate::api, and none of the
#   face's types through the crate root (crate::Redlock, RedlockBuilder,
#   LockGuard, LockWatch, Stats);
# - no library file in src/ (src/bin/ aside) is over 550 lines.
#
# Comment lines (`//`, `///`, `//!`) are skipped: a doc link may point
# anywhere. Grouped imports (`use crate::{api::x, ...}`) are followed across
# lines. Prints each violation as file:line: text and exits 1 if any.
set -euo pipefail
cd "$(dirname "$0")/.."

max_lines=550
status=0

# Prints the non-comment lines of the files given (file:line: text) that
# name one of the paths in the extended regex $1, inside or outside a
# grouped `use crate::{ ... }` import.
offending() {
  local pattern="$1"
  shift
  awk -v pat="$pattern" '
    FNR == 1 { group = 0 }
    {
      line = $0
      sub(/^[ \t]+/, "", line)
      if (line ~ /^\/\//) next
      code = $0
      sub(/\/\/.*$/, "", code)
      if (code ~ /use[ \t]+crate::\{/) group = 1
      text = code
      if (group) gsub(/(^|[^A-Za-z_:])(api|engine)::/, " crate::&", text)
      if (text ~ pat) printf "%s:%d: %s\n", FILENAME, FNR, $0
      if (group && code ~ /\};?/) group = 0
    }
  ' "$@"
}

report() {
  local what="$1" found="$2"
  if [ -n "$found" ]; then
    printf '%s\n%s\n' "$what" "$found" >&2
    status=1
  fi
}

mapfile -t protocol < <(find src/protocol -name '*.rs' | sort)
mapfile -t engine < <(find src/engine -name '*.rs' | sort)

report "protocol imports a higher layer (engine or api):" \
  "$(offending 'crate::[ ]*(engine|api)([^A-Za-z_]|$)' "${protocol[@]}")"
report "protocol uses tokio or a redis connection type:" \
  "$(offending '(^|[^A-Za-z_])tokio(::|[^A-Za-z_]|$)|redis::aio|MultiplexedConnection|redis::Client|PubSub' "${protocol[@]}")"
report "engine imports the face (api):" \
  "$(offending 'crate::[ ]*api([^A-Za-z_]|$)|crate::(Redlock|RedlockBuilder|LockGuard|LockWatch|Stats)([^A-Za-z_]|$)' "${engine[@]}")"

long="$(find src -name '*.rs' -not -path 'src/bin/*' -print0 | xargs -0 wc -l |
  awk -v max="$max_lines" '$2 != "total" && $1 > max { printf "%s: %d lines\n", $2, $1 }')"
report "library files over $max_lines lines:" "$long"

if [ "$status" -eq 0 ]; then
  files="$(find src -name '*.rs' -not -path 'src/bin/*' | wc -l)"
  longest="$(find src -name '*.rs' -not -path 'src/bin/*' -print0 | xargs -0 wc -l |
    awk '$2 != "total" && $1 > n { n = $1; f = $2 } END { printf "%s (%d lines)", f, n }')"
  echo "layers ok: protocol pure, engine below the face; $files library files, the longest $longest"
fi
exit "$status"
