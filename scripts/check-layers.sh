#!/usr/bin/env bash
# The layer rules of src/ (see ARCHITECTURE.md), checked with grep and awk:
#
# - src/protocol/ is pure: no import of crate::engine or crate::api, no
#   tokio, no redis connection types (redis::aio, MultiplexedConnection,
#   redis::Client);
# - src/engine/ never imports the face: no crate::api, and none of the
#   face's types through the crate root (crate::Redlock, RedlockBuilder,
#   LockGuard, LockWatch, Stats);
# - no import circle between the library's files, but for the builder and
#   the face (api/builder.rs and api/redlock.rs import each other);
# - no file in src/ (the command's in src/bin/ included) is over 550 lines.
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

# The import graph of the library's modules (crate::, super:: and a
# mod.rs's relative `use child::`), and any circle in it.
cycles="$(find src -name '*.rs' -not -path 'src/bin/*' | sort | awk '
  function module(file,   m) {
    m = file
    sub(/^src\//, "", m); sub(/\.rs$/, "", m); sub(/\/mod$/, "", m)
    gsub(/\//, "::", m)
    return m
  }
  function resolve(path,   n, parts, k, c, j) {
    n = split(path, parts, "::")
    for (k = n; k >= 1; k--) {
      c = parts[1]
      for (j = 2; j <= k; j++) c = c "::" parts[j]
      if (c in known) return c
    }
    return ""
  }
  function edge(from, path,   to) {
    to = resolve(path)
    if (to != "" && to != from && !((from, to) in seen)) {
      seen[from, to] = 1
      adj[from] = adj[from] " " to
    }
  }
  function dfs(v, trail,   list, n, i, w) {
    color[v] = 1
    n = split(adj[v], list, " ")
    for (i = 1; i <= n; i++) {
      w = list[i]
      if (color[w] == 1) { print "circle: " trail " -> " w; found = 1 }
      else if (color[w] == 0) dfs(w, trail " -> " w)
    }
    color[v] = 2
  }
  { files[++count] = $0; known[module($0)] = 1 }
  END {
    for (f = 1; f <= count; f++) {
      file = files[f]; m = module(file)
      ismod = (file ~ /\/mod\.rs$/ || file == "src/lib.rs")
      parent = m; if (!ismod) sub(/(::)?[a-z_0-9]+$/, "", parent)
      while ((getline line < file) > 0) {
        code = line
        if (code ~ /^[ \t]*\/\//) continue
        sub(/\/\/.*$/, "", code)
        rest = code
        while (match(rest, /crate::[a-z_0-9:]*[a-z_0-9]/)) {
          edge(m, substr(rest, RSTART + 7, RLENGTH - 7)); rest = substr(rest, RSTART + RLENGTH)
        }
        rest = code
        while (!ismod && match(rest, /super::[a-z_0-9:]*[a-z_0-9]/)) {
          edge(m, (parent == "" ? "" : parent "::") substr(rest, RSTART + 7, RLENGTH - 7)); rest = substr(rest, RSTART + RLENGTH)
        }
        if (ismod && match(code, /^[ \t]*(pub(\(crate\))? )?use [a-z_0-9]+::/) && code !~ /use (crate|super|self|std|core|alloc|redis|tokio|futures|rand|thiserror|tracing|metrics|rustls)::/) {
          sub(/^[ \t]*(pub(\(crate\))? )?use /, "", code)
          if (m != "lib") edge(m, m "::" code)
        }
      }
      close(file)
    }
    # The one circle allowed: the builder and the face.
    sub(/ api::redlock/, "", adj["api::builder"])
    for (v in known) if (color[v] == 0 && v != "lib") dfs(v, v)
  }
')"
report "import circles between library files:" "$cycles"

long="$(find src -name '*.rs' -print0 | xargs -0 wc -l |
  awk -v max="$max_lines" '$2 != "total" && $1 > max { printf "%s: %d lines\n", $2, $1 }')"
report "files in src/ (the command's included) over $max_lines lines:" "$long"

if [ "$status" -eq 0 ]; then
  files="$(find src -name '*.rs' -not -path 'src/bin/*' | wc -l)"
  longest="$(find src -name '*.rs' -not -path 'src/bin/*' -print0 | xargs -0 wc -l |
    awk '$2 != "total" && $1 > n { n = $1; f = $2 } END { printf "%s (%d lines)", f, n }')"
  echo "layers ok: protocol pure, engine below the face, no import circle but builder and face; $files library files, the longest $longest"
fi
exit "$status"
