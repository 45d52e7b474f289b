"""Planted problems in a DDP loop (run it with torchrun): gradient accumulation that all-reduces every
micro-batch (no ``no_sync()``), ``find_unused_parameters=True`` on a model whose unused head is the same
every step, and each rank asking for every core.

`pitstop profile -- torchrun --nproc_per_node=2 examples/ddp_accum.py` should report ``ddp.no_sync``,
``ddp.find_unused_parameters`` and ``distributed.threads``; `pitstop fix -- torchrun ...` measures
``no_sync``, ``static_graph`` and the thread split on the whole job.

    torchrun --nproc_per_node=2 examples/ddp_accum.py [--accum 4] [--width 512] [--steps 200]
"""

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, 4)
        self.aux_head = nn.Linear(width, 4)  # never used in forward: DDP must be told, or search for it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # planted: every rank takes every core
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x = torch.randn(args.batch_size * args.accum * 64, 64)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    data = TensorDataset(x, y)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, seed=0))
    model = DDP(Net(args.width), find_unused_parameters=True)  # planted: searched every forward
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step, epoch = 0, 0
    while step < args.steps:
        loader.sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(xb), yb) / args.accum
            loss.backward()  # planted: all-reduces every micro-batch, not only the last
            if (i + 1) % args.accum == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if step == args.steps:
                    break
        epoch += 1
    if dist.get_rank() == 0:
        print(f"loss {loss.item() * args.accum:.4f}")
    # torch 2.14's gloo worker thread can free the last all-reduce at interpreter exit, after Python
    # stopped taking its GIL, and abort (SIGABRT, "terminate called without an active exception", 1 run
    # in 4 on a 2-core EPYC): free DDP and its pending work while Python still runs, then leave together
    del model, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
