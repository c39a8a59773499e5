#!/usr/bin/env bash
# Validates .github/workflows/*.yml against GitHub's workflow schema and
# docker-compose.redlock.yml and docker-compose.redlock-clusters.yml against the compose specification, offline, with
# check-jsonschema's vendored schemas (installed from PyPI into target/ when
# missing). Docker itself cannot run on every CI machine; this catches a
# malformed file all the same.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="target/schema-venv"
if [ ! -x "$venv/bin/check-jsonschema" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet check-jsonschema
fi
"$venv/bin/check-jsonschema" --builtin-schema vendor.github-workflows .github/workflows/*.yml
"$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.redlock.yml docker-compose.redlock-clusters.yml
