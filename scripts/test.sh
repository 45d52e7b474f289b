#!/usr/bin/env bash
# The test command: bootstrap the virtualenv, lint (ruff, then the import contracts), then run every test
# (pass pytest arguments through, e.g. `bash scripts/test.sh -m "not slow"`). Installs Debian's chromium
# for the HTML render test when possible; that test skips cleanly where it cannot be had.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "chromium not installed; the HTML render test will skip" >&2
fi
.venv/bin/ruff check .
.venv/bin/lint-imports  # the layers and no import cycles ([tool.importlinter] in pyproject.toml)
exec .venv/bin/python -m pytest "$@"
