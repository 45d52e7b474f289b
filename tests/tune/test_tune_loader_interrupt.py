"""``pitstop tune loader -- python train.py`` stopped by Ctrl-C while the tuner in the script is stuck in
a measurement (one that ignores Ctrl-C, as a worker slow to shut down does, so the script is killed):
the report still holds every point measured before, and says it was interrupted (issue 31)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import signal
    import sys
    import time

    import torch
    from torch.utils.data import DataLoader, Dataset

    import pitstop.tune.loader as tuner
    from pitstop.tune.loader_measure import LoaderPoint

    measured = []


    def measure_setting(dataset, setting, base_kwargs, cfg):
        # the real measurement's stand-in: three points, then one that ignores Ctrl-C
        if len(measured) == 3:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            print("pitstop-test: 3 points measured", file=sys.stderr, flush=True)
            time.sleep(120)
        measured.append(setting)
        rate = 10.0 + setting.num_workers
        return LoaderPoint(setting=setting, batches_per_s=rate, windows=[rate], batches=10, seconds=10 / rate)


    tuner.measure_setting = measure_setting


    class Items(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.zeros(4), i % 2


    for x, y in DataLoader(Items(), batch_size=4):
        pass
    """
)


@pytest.mark.slow
def test_ctrl_c_in_script_mode_keeps_the_points_measured(tmp_path):
    script, out = tmp_path / "train.py", tmp_path / "loader.json"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "pitstop", "tune", "loader", "--max-workers", "8", "-q", "--json", str(out)]
    proc = subprocess.Popen(
        [*cmd, "--", sys.executable, str(script)], stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # the script's tuner says when the fourth measurement hangs
        if "pitstop-test: 3 points measured" in line:
            break
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    doc = json.loads(out.read_text())
    points = doc["sections"]["loader_tune"]["points"]
    assert [p["setting"]["num_workers"] for p in points] == [0, 1, 2]
    assert doc["meta"]["interrupted"] and doc["error"].startswith("interrupted: the report holds the points")
    line = SCRIPT.splitlines().index("for x, y in DataLoader(Items(), batch_size=4):") + 1
    best = doc["findings"][0]
    assert best["id"] == "tune.loader.best" and best["location"].endswith(f"train.py:{line}")
