#!/usr/bin/env bash
# Refresh requirements.lock, the pinned set every install goes through (README's two commands, .ci/run,
# ops/install-worker.sh), so a Mac installed today and one installed next month run the same packages.
#
#   ops/lock.sh             # re-resolve after a pyproject.toml change; keeps every pin it can
#   ops/lock.sh --upgrade   # move every pin to the newest release the specifiers allow
#
# One universal file with markers, resolved for the environments pyproject's [tool.uv] names (Apple
# Silicon and Linux, CPython 3.11+). uv comes with the dev extra (.venv/bin/uv); UV=... picks another.
set -euo pipefail
cd "$(dirname "$0")/.."
UV="${UV:-.venv/bin/uv}"
exec "$UV" pip compile pyproject.toml --extra dev --extra parity --universal --python-version 3.11 \
  --custom-compile-command "ops/lock.sh" --quiet -o requirements.lock "$@"
