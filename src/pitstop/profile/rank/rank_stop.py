"""``--steps N`` across ranks: every rank leaves at the same step boundary, lockstep or not.

A rank that has measured its steps does not leave at once: its peers may still be in the steps before,
in collectives that need it (an async all-reduce in flight, a collective only every few steps, ranks of
different speed with no collective in between). At the boundary after its last measured step it checks
in with torch.distributed's own key-value store (the default process group's store, else a client of the
launcher's TCPStore at MASTER_ADDR:MASTER_PORT) and waits until every rank of the world has checked in at
the same step; then all stop. The wait is outside any collective, so nothing it does can change what the
ranks compute; while it waits, the rank's state says so, and the parent treats a rank stopped there like
one that has ended when another is stuck in a collective (``pitstop.profile.runs.ranks.stuck``).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

PREFIX = "pitstop/stop"
CONNECT_S = 10.0
POLL_S = 0.02  # between checks of the store while waiting


def default_store() -> Any:
    """The store of the default process group, or a client of the launcher's store; None if neither."""
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        if dist.is_available() and dist.is_initialized():
            from torch.distributed.distributed_c10d import _get_default_store

            return _get_default_store()
    from pitstop.profile.rank.rank_share import launcher_store

    return launcher_store(CONNECT_S)


def job_id(fallback: str) -> str:
    """A name every rank of one launch shares on every node: torchrun's rendezvous id and store address,
    else Slurm's job and step, else ``fallback`` (one node's run folder, which other nodes do not share)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        return f"{env['TORCHELASTIC_RUN_ID']}@{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    if "SLURM_JOB_ID" in env:
        return f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    return fallback


def key(run: str, step: int, name: str) -> str:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{PREFIX}/{run}/{restart}/{step}/{name}"


def agree(run: str, step: int, world: int, timeout_s: float, store: Any = None) -> str | None:
    """Check in at ``step`` and wait for the ``world`` ranks to do the same. Returns None when all did,
    else why this rank stops without them (no store, the wait timed out)."""
    if world <= 1:
        return None
    store = store if store is not None else default_store()
    if store is None:
        return "no torch.distributed store to agree on the stop step through"
    deadline = time.monotonic() + timeout_s
    try:
        if store.add(key(run, step, "arrived"), 1) >= world:
            store.set(key(run, step, "go"), b"1")
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    go = key(run, step, "go")
    while True:  # polled: a signal (the parent's Ctrl-C or stop) is handled between checks
        try:
            if store.check([go]):
                return None
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        if time.monotonic() > deadline:
            return f"the other ranks did not reach step {step} within {timeout_s:g} s"
        time.sleep(POLL_S)
