"""Run under torchrun (or alone): train a small MLP with ``fit`` and save the final parameters per rank.

Under DDP each rank gets every other sample (DistributedSampler, no shuffle) in micro-batches of 8 with
2-step accumulation, so one optimizer step covers samples [32i, 32i+32) — the same global batch a single
process sees with batch size 32.
"""

from __future__ import annotations

import argparse
import os

import torch

from pitstop.train import TrainConfig, distributed_sampler, fit, init_distributed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--accum", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 10, generator=g)
    y = torch.randint(0, 3, (96,), generator=g)
    ds = torch.utils.data.TensorDataset(x, y)
    env = init_distributed("cpu")
    sampler = distributed_sampler(ds, env, shuffle=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, sampler=sampler, shuffle=False)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cfg = TrainConfig(
        epochs=3,
        accum_steps=a.accum,
        precision="fp32",
        progress=False,
        checkpoint_path=os.path.join(a.out, "ckpt.pt"),
        checkpoint_every=2,
    )
    res = fit(model, opt, loader, torch.nn.functional.cross_entropy, cfg)
    torch.save(
        {
            "params": [p.detach().clone() for p in model.parameters()],
            "steps": res.steps,
            "applied": res.applied,
        },
        os.path.join(a.out, f"rank{env.rank}.pt"),
    )


if __name__ == "__main__":
    main()
