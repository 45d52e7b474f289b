"""Child process for the resume tests: trains a small model with ``fit`` and logs every step's loss.

--pause-after-step N: after step N's loss is logged (before its checkpoint), say so on stdout and wait to
be killed. --pause-in-save-at-step M: make step M's checkpoint save stop half-way (test hook) and wait.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

import torch

from pitstop.train import TrainConfig, fit
from pitstop.train.checkpoint_io import PAUSE_ENV


def make_data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 1, 8, 8, generator=g)
    y = torch.randint(0, 4, (96,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)


def make_model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.2),  # draws from the RNG every step: resume must restore it
        torch.nn.Flatten(),
        torch.nn.Linear(256, 4),
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--pause-after-step", type=int)
    p.add_argument("--pause-in-save-at-step", type=int)
    a = p.parse_args()
    torch.set_num_threads(1)

    def on_log(row: dict) -> None:
        with open(a.log, "a") as fh:
            fh.write(json.dumps({"step": row["step"], "loss": row["loss"], "lr": row["lr"]}) + "\n")
        if row["step"] == a.pause_after_step:
            print(f"paused-after-step {row['step']}", flush=True)
            threading.Event().wait()  # until SIGKILL
        if row["step"] == a.pause_in_save_at_step:
            os.environ[PAUSE_ENV] = "/dev/stdout"  # this step's save stops half-way and says so

    cfg = TrainConfig(
        epochs=4,
        lr=1e-2,
        accum_steps=2,
        schedule="onecycle",
        precision="fp32",
        log_every=1,
        progress=False,
        checkpoint_path=a.ckpt,
        checkpoint_every=1,
        seed=2,
    )
    model = make_model()
    res = fit(model, None, make_data(), torch.nn.functional.cross_entropy, cfg, on_log=on_log)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    print(
        json.dumps(
            {"done": res.steps, "resumed_from": res.resumed_from_step, "param_sum": params.sum().item()}
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
