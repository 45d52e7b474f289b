"""DDP's comm hook, timed: each bucket's launch and completion, and what a backward's rounds add up to.

``TimedHook`` wraps the hook DDP runs per gradient bucket (the script's own, or
``default_hooks.allreduce_hook``). It is a callable object rather than a closure so that a DDP model still
pickles and deep-copies as without pitstop: both give back the hook it wraps.

Any Python comm hook costs each bucket a Python call on the thread running backward and a Python callback
on the backend's thread (it must take the GIL) where DDP's built-in reduction runs none. For
``default_hooks.allreduce_hook`` (what pitstop installs when the script registered no hook) the hook's
arithmetic is done here with one callback per bucket, which both times the bucket and unwraps the
result, instead of that hook's own callback plus pitstop's.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

clock = time.perf_counter


def _same(hook: Any) -> Any:
    return hook


class TimedHook:
    """``hook(state, bucket)`` with the bucket recorded in the recorder's current backward round."""

    def __init__(self, rec: Any, hook: Any, ddp: Any) -> None:
        self.rec = rec
        self.hook = hook
        self.ddp = weakref.ref(ddp)
        # the names DDP's checks and logger read
        self.__name__ = getattr(hook, "__name__", "hook")
        self.__qualname__ = getattr(hook, "__qualname__", self.__name__)

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _same, (self.hook,)

    # no annotations: DDP checks the hook's signature, and accepts none (strings are not accepted)
    def __call__(self, state, bucket):
        rec = self.rec
        t = clock()
        rnd = rec._round
        if rnd is None or rnd["closed"]:
            rnd = rec._open_round(self.ddp(), t)
        buf = bucket.buffer()
        b: dict[str, Any] = {
            "launch": t,
            "done": None,
            "bytes": buf.numel() * buf.element_size(),
            "events": None,
        }
        if buf.is_cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            b["events"] = [start, None]
        rnd["buckets"].append(b)
        rnd["last_launch"] = t
        if bucket.is_last():
            rnd["closed"] = True
        unwrap = self.hook is allreduce_hook and not buf.is_complex()  # dist.all_reduce views complex as real
        if unwrap:  # its arithmetic (divide by the group size, all-reduce), without its own callback
            group = state if state is not None else dist.group.WORLD
            buf.div_(group.size())
            fut = group.allreduce([buf]).get_future()
        else:
            rec._local.inside = True
            try:
                fut = self.hook(state, bucket)
            finally:
                rec._local.inside = False

        def done(f: Any) -> Any:
            value = f.value()  # raises when the peer is gone: the round stays the one it failed in
            if unwrap:
                value = value[0]
            b["done"] = clock()
            if b["events"] is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                b["events"][1] = end
            if rnd["closed"] and all(x["done"] is not None for x in rnd["buckets"]):
                rec.current = None
            return value

        return fut.then(done)


def spans_of(rnd: dict[str, Any]) -> tuple[float, float] | None:
    """(all-reduce time, the part after the last bucket was ready) of one backward; None while a bucket
    is still in flight."""
    buckets = rnd["buckets"]
    if not buckets or any(b["done"] is None for b in buckets):
        return None
    if all(b["events"] and b["events"][1] is not None for b in buckets):
        # on the GPU: intervals relative to the first launch event
        e0 = buckets[0]["events"][0]
        iv = [(e0.elapsed_time(b["events"][0]) / 1e3, e0.elapsed_time(b["events"][1]) / 1e3) for b in buckets]
    else:
        iv = [(b["launch"], b["done"]) for b in buckets]
    last_ready = max(a for a, _ in iv)
    end = max(b for _, b in iv)
    return _union(iv), max(0.0, end - last_ready)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a  # type: ignore[operator]
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a  # type: ignore[operator]
    return total
