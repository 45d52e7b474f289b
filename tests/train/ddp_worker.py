"""Run under torchrun (or alone): train a small MLP with ``fit`` and save the final parameters per rank.

Under DDP each rank gets every other sample (DistributedSampler, no shuffle) in micro-batches of 8 with
2-step accumulation, so one optimizer step covers samples [32i, 32i+32) — the same global batch a single
process sees with batch size 32.
"""

from __future__ import annotations

import argparse
import os

import torch

from pitstop.train import TrainConfig, distributed_sampler, fit, init_distributed, load_checkpoint, wrap_fsdp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--strategy", default="auto")
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
    fsdp = a.strategy == "fsdp"

    def opt(m: torch.nn.Module) -> torch.optim.Optimizer:  # built after wrapping: FSDP replaces parameters
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    cfg = TrainConfig(
        epochs=3,
        accum_steps=a.accum,
        precision="fp32",
        progress=False,
        distributed=a.strategy,
        fsdp_shard=(torch.nn.Linear,),
        checkpoint_path=os.path.join(a.out, "ckpt.pt"),
        checkpoint_every=2,
    )
    res = fit(model, opt, loader, torch.nn.functional.cross_entropy, cfg)
    # Load the final checkpoint into a fresh (sharded) model: it must hold exactly the trained weights.
    torch.manual_seed(5)
    fresh = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    if fsdp:
        wrap_fsdp(fresh, env, (torch.nn.Linear,))
    state = load_checkpoint(os.path.join(a.out, "ckpt.pt"), fresh, opt(fresh))
    ckpt_ok = state.step == res.steps and all(
        torch.equal(_full(p), _full(q)) for p, q in zip(model.parameters(), fresh.parameters(), strict=True)
    )
    torch.save(
        {
            "params": [_full(p) for p in model.parameters()],
            "steps": res.steps,
            "applied": res.applied,
            "ckpt_ok": ckpt_ok,
        },
        os.path.join(a.out, f"rank{env.rank}.pt"),
    )


def _full(p: torch.Tensor) -> torch.Tensor:
    # FSDP2 parameters are DTensors sharded over ranks; gather the whole tensor to compare.
    from torch.distributed.tensor import DTensor

    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()


if __name__ == "__main__":
    main()
