#!/usr/bin/env bash
# Create ./.venv with the pinned torch build and pitstop (editable, with dev extras). Idempotent:
# re-runs only when pyproject.toml or this script changed. Override the interpreter with PYTHON=...
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${PITSTOP_VENV:-.venv}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "pitstop needs Python 3.11+; set PYTHON=/path/to/python3.11" >&2; exit 2; }
want=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)
stamp="$VENV/.pitstop-stamp"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "pitstop: setting up $VENV (torch 2.14.1 + torchvision 0.29.1; a few minutes the first time)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.14.1" "torchvision==0.29.1"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]"
echo "$want" > "$stamp"
