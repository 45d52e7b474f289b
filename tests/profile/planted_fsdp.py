"""A two-layer model sharded with FSDP2 (``fully_shard``), for the multi-rank profile tests."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

torch.set_num_threads(1)
dist.init_process_group("gloo")
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(1000):
    loss = model(torch.randn(8, 32)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
