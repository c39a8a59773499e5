#!/usr/bin/env bash
# Makes sure `redis-server` can be run: installs Debian's package when it is
# missing, and checks that it is 7.0 or later (`SET … NX … GET` came in
# 7.0). Prints one clear message and fails when it cannot.
set -euo pipefail

server="${REDIS_SERVER:-redis-server}"

# Fails with a clear message when the server is older than 7.0.
check_version() {
  local version major
  version="$("$server" --version 2>/dev/null | sed -n 's/.* v=\([0-9][0-9.]*\).*/\1/p')"
  major="${version%%.*}"
  if [ -z "$major" ]; then
    echo "warning: could not read the version of $server; Redis 7.0 or later is needed" >&2
    return 0
  fi
  if [ "$major" -lt 7 ]; then
    echo "error: $server is version $version; Redis 7.0 or later is needed (SET with NX and GET)." >&2
    echo "       Install a newer Redis (or Valkey), set REDIS_SERVER to the path of one, or" >&2
    echo "       start the five-node cluster with REDLOCK_COMPOSE=1 (Docker Compose)." >&2
    exit 1
  fi
}

# The TLS tests make a throwaway CA with the openssl command.
packages=""
command -v openssl >/dev/null 2>&1 || packages="openssl"
if command -v "$server" >/dev/null 2>&1 && [ -z "$packages" ]; then
  check_version
  exit 0
fi
command -v "$server" >/dev/null 2>&1 || packages="$packages redis-server"

echo "missing:$packages; installing with apt-get..." >&2
if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
else
  echo "error: redis-server is missing and this user cannot install it." >&2
  echo "       Install it (Debian/Ubuntu: apt-get install redis-server), or start" >&2
  echo "       the five-node cluster with Docker Compose and set REDLOCK_NODES." >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: redis-server is missing and there is no apt-get here." >&2
  echo "       Install Redis 7.0 or later with your package manager, or set REDIS_SERVER" >&2
  echo "       to the path of a redis-server binary." >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $packages >/dev/null
# Debian's package starts a system service on 6379; the tests start their own
# servers on free ports and do not use it.
command -v redis-server >/dev/null 2>&1 || { echo "error: redis-server install failed" >&2; exit 1; }
echo "installed: $(redis-server --version)" >&2
check_version
