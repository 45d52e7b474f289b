"""Ranks that count steps differently (run by torchrun): rank 1 takes two micro-batches per optimizer
step, each with a blocking all_reduce, rank 0 one. Rank 0 measures its steps first; rank 1 then waits in
an all_reduce that rank 0 never joins."""

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(100000):
    for _ in range(1 + rank):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        dist.all_reduce(loss.detach().clone())
    opt.step()
    opt.zero_grad()
