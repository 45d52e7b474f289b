"""Planted causes for the multi-rank profile tests (run by torchrun; each cause switched on by a variable)."""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

env = os.environ.get
threads = len(os.sched_getaffinity(0)) if env("OVERSUBSCRIBE") else 1
torch.set_num_threads(threads)
dist.init_process_group("gloo")
rank = dist.get_rank()
SLOW_S = float(env("SLOW_RANK_S", "0"))
ACCUM = int(env("ACCUM", "1"))


class Data(Dataset):
    def __len__(self):
        return int(env("ITEMS", "100000"))  # a short run (ITEMS / 8 steps) ends by itself

    def __getitem__(self, i):
        if rank == 1 and SLOW_S:
            time.sleep(SLOW_S / 8)  # the planted straggler: rank 1's input path is slow
        return torch.randn(32), i % 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4))
        self.spare = nn.Linear(32, 4)  # unused when SKIP_SPARE

    def forward(self, x):
        return self.body(x) + (0 if env("SKIP_SPARE") else self.spare(x))


ddp = nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=bool(env("FIND_UNUSED")))
if env("COMM_HOOK") == "builtin":  # a C++ hook: runs inside the reducer
    ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
elif env("COMM_HOOK") == "fp16":
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
for i, (x, y) in enumerate(DataLoader(Data(), batch_size=8)):
    step = i // ACCUM
    if rank == 1 and env("RAISE_AT") and step == int(env("RAISE_AT")):
        raise ValueError(f"planted failure at step {step}")
    if rank == 1 and env("HANG_AT") and step == int(env("HANG_AT")):
        time.sleep(600)  # alive but never reaching the all-reduce rank 0 waits in
    if rank == 1 and env("EXIT_AT") and step == int(env("EXIT_AT")):
        os._exit(3)  # gone without a word, while rank 0 goes on into the all-reduce
    loss = nn.functional.cross_entropy(ddp(x), y) / ACCUM
    loss.backward()
    if (i + 1) % ACCUM == 0:
        opt.step()
        opt.zero_grad()
    if env("EXPLICIT"):
        t = loss.detach().clone()
        dist.all_reduce(t)
