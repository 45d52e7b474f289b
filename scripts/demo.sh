#!/usr/bin/env bash
# The main job on a built-in example: profile an unmodified training script with a planted problem
# (JPEG decoding and augmentation in the training process, num_workers=0) and write the HTML report.
# Extra arguments go to `pitstop profile`, e.g. `bash scripts/demo.sh --trace`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/pitstop profile --steps 20 --html pitstop-report-profile.html "$@" -- python examples/slow_loader.py
echo "open pitstop-report-profile.html; try the other examples too: examples/item_sync.py, conv_fp32.py, healthy.py" >&2
