"""No DDP: explicit collectives, blocking and async, with rank 1's steps slower (run by torchrun)."""

import time

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
work = None
for i in range(100000):
    if rank == 1:
        time.sleep(0.03)  # rank 1's steps are slower: the ranks are not in lockstep between collectives
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    if i % 3 == 0:  # a blocking collective every third step only
        dist.all_reduce(model.weight.grad)
    opt.step()
    opt.zero_grad()
    if work is not None:
        work.wait()
    work = dist.all_reduce(loss.detach().clone(), async_op=True)  # in flight across the step boundary
