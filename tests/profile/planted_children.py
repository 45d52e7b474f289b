"""Training in torch.multiprocessing children, for tests/profile/test_profile_children.py.

Each child trains a small model (a BatchNorm in it: its running statistics are buffers a forward writes)
for ``STEPS`` steps on data from a fixed seed. The model is made in the parent and shared with the
children (``SHARED=1``, Hogwild) or made in each child. Environment:

- ``LAUNCH``: ``process`` (``mp.Process(...).start()``, start method ``START``), ``spawn`` (``mp.spawn``),
  ``pool`` (``Pool.map`` of the training over ``CHILDREN`` workers, start method ``START``; a barrier
  makes each worker take one task) or ``nested`` (one child trains as rank 0 and starts its own child,
  which trains as rank 1)
- ``CHILDREN`` (2), ``STEPS`` (12), ``CRASH_AT``: child 1 raises at that step, ``HANG_AT``: child 1
  sleeps forever in that step, ``SIGNAL_AT``: child 1 sends itself ``SIGNAL`` (``KILL``, ``INT``) there
- ``TERMINATE=1``: child 1 trains until the parent, once child 0 has ended and child 1 has taken 4 steps,
  calls its ``terminate()`` (needs ``RESULTS``)
- ``RESULTS``: a folder; each child writes ``child-R.txt`` (its model's checksum when it ends, in full
  precision), the parent ``parent.txt`` (the shared model's checksum after the children, and whether each
  Process object kept its own target)
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch import nn

STEPS = int(os.environ.get("STEPS", "12"))
CRASH_AT = int(os.environ.get("CRASH_AT", "-1"))
HANG_AT = int(os.environ.get("HANG_AT", "-1"))
SIGNAL_AT = int(os.environ.get("SIGNAL_AT", "-1"))
RESULTS = os.environ.get("RESULTS")


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))


def checksum(model: nn.Module) -> str:
    return repr([float(t.double().sum()) for t in model.state_dict().values()])


def train(rank: int, model: nn.Module | None = None) -> None:
    model = model if model is not None else make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(10**9 if rank == 1 and os.environ.get("TERMINATE") else STEPS):
        x = torch.randn(64, 16, generator=g)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if rank == 1 and step == CRASH_AT:
            raise RuntimeError(f"planted crash in child 1 at step {step}")
        if rank == 1 and step == SIGNAL_AT:
            os.kill(os.getpid(), getattr(signal, "SIG" + os.environ["SIGNAL"]))
        if rank == 1 and step == HANG_AT:
            time.sleep(10**6)  # HANG
        opt.step()
        if rank == 1 and step == 3 and RESULTS:
            Path(RESULTS, "child-1-trains").touch()
    if RESULTS:
        Path(RESULTS, f"child-{rank}.txt").write_text(checksum(model))


BARRIER = None


def pool_init(barrier) -> None:
    global BARRIER
    BARRIER = barrier


def pool_task(rank: int) -> int:
    BARRIER.wait()  # every worker holds a task before any trains: one task each
    train(rank)
    return rank


def nested(start: str) -> None:
    child = mp.get_context(start).Process(target=train, args=(1,))
    child.start()
    train(0)
    child.join()


def main() -> None:
    n = int(os.environ.get("CHILDREN", "2"))
    shared = os.environ.get("SHARED") == "1"
    model = make_model().share_memory() if shared else None
    launch = os.environ.get("LAUNCH", "process")
    start = os.environ.get("START", "fork")
    if launch == "spawn":
        mp.spawn(train, args=(model,), nprocs=n)
        kept = "True"
    elif launch == "pool":
        ctx = mp.get_context(start)
        with ctx.Pool(n, initializer=pool_init, initargs=(ctx.Barrier(n),)) as pool:
            kept = f"pool {pool.map(pool_task, range(n), chunksize=1)}"
    elif launch == "nested":
        child = mp.get_context(start).Process(target=nested, args=(start,))
        child.start()
        child.join()
        kept = f"nested {child.exitcode}"
    else:
        ctx = mp.get_context(start)
        procs = [ctx.Process(target=train, args=(r, model)) for r in range(n)]
        for p in procs:
            p.start()
        kept = all(getattr(p, "_target", train) is train for p in procs)  # no pitstop object left on them
        if os.environ.get("TERMINATE"):
            procs[0].join()
            while not Path(RESULTS or ".", "child-1-trains").exists():  # once it has taken a few steps
                time.sleep(0.05)
            procs[1].terminate()
        for p in procs:
            p.join()
        kept = f"{kept} {[p.exitcode for p in procs]}"
    if model is not None:
        model.eval()
        with torch.no_grad():  # the parent's evaluation forward
            model(torch.randn(8, 16))
    if RESULTS:
        Path(RESULTS, "parent.txt").write_text(f"{checksum(model) if model is not None else None}\n{kept}")
    sys.exit(0)


if __name__ == "__main__":
    main()
