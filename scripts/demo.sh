#!/usr/bin/env bash
# The main job on a built-in example: audit this machine, then write the HTML report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/pitstop doctor --html pitstop-doctor.html "$@"
