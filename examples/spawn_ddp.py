"""DistributedDataParallel started with ``torch.multiprocessing.spawn`` instead of torchrun: the script
picks a free port, spawns ``--processes`` ranks, and each joins a gloo process group, wraps a small MLP
in DDP and trains on its shard of made-up data. Rank 0 prints the loss; the parent prints when all are
done.

    python examples/spawn_ddp.py [--processes 2] [--samples 2048] [--batch-size 32]
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def made_up(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g)
    return TensorDataset(x, (x[:, :8].sum(1) > 0).long())


def train(rank: int, world: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 2)))
    data = made_up(args.samples, args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, world, rank))
    optimizer = optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if rank == 0 and i % 20 == 0:
                print(f"epoch {epoch} step {i}: loss {loss.item():.4f}")
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(train, args=(args.processes, args), nprocs=args.processes)
    print(f"trained on {args.processes} processes")


if __name__ == "__main__":
    main()
