"""CUDA memory: peaks, fragmentation, and on an out-of-memory error a snapshot with its largest
allocations by ``file:line``.

The allocator records the Python stack of each live block (``torch.cuda.memory._record_memory_history``
with ``context="state"``: no event ring) from the moment the script first puts a tensor on CUDA until
the warm-up steps end, so the measured steps do not pay for it. An OOM in the first steps, where most
come, gets every live block's ``file:line``; a later one the blocks allocated while it recorded.
``PITSTOP_MEMORY_HISTORY=0`` turns it off, ``=all`` keeps it on for the whole run. The snapshot
(``_snapshot()``, the format https://pytorch.org/memory_viz reads) is written next to the report as
``memory_snapshot.pickle``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

SNAPSHOT = "memory_snapshot.pickle"
HISTORY_ENTRIES = 100_000
TOP_N = 10


def _cuda() -> Any:
    import torch

    return torch.cuda


_recording: list[Any] = []  # the cuda module history was started on (stop only what was started)


def start_history(cuda: Any = None) -> bool:
    """Record the Python stack of each live allocation."""
    if os.environ.get("PITSTOP_MEMORY_HISTORY", "1") == "0" or _recording:
        return False
    cuda = cuda or _cuda()
    try:
        cuda.memory._record_memory_history(context="state", stacks="python", max_entries=HISTORY_ENTRIES)
    except Exception:
        return False
    _recording.append(cuda)
    return True


def stop_history() -> None:
    """At the end of the warm-up (unless ``PITSTOP_MEMORY_HISTORY=all``); a no-op when it never started,
    so a CPU-only script never touches CUDA."""
    if not _recording or os.environ.get("PITSTOP_MEMORY_HISTORY") == "all":
        return
    cuda = _recording.pop()
    with contextlib.suppress(Exception):
        cuda.memory._record_memory_history(enabled=None)


def memory_facts(device: Any, cuda: Any = None) -> dict[str, Any]:
    """Peak allocated and reserved bytes, and fragmentation: memory the caching allocator holds but no
    tensor uses (reserved - allocated), at the end and at the peaks."""
    if device is None or getattr(device, "type", None) != "cuda":
        return {}
    cuda = cuda or _cuda()
    try:
        peak_alloc = int(cuda.max_memory_allocated(device))
        peak_res = int(cuda.max_memory_reserved(device))
        alloc = int(cuda.memory_allocated(device))
        res = int(cuda.memory_reserved(device))
    except Exception as e:
        return {"cuda_memory_error": f"{type(e).__name__}: {e}"}
    return {
        "cuda_peak_allocated_bytes": peak_alloc,
        "cuda_peak_reserved_bytes": peak_res,
        "cuda_allocated_bytes": alloc,
        "cuda_reserved_bytes": res,
        "cuda_fragmentation_bytes": max(0, res - alloc),
        "cuda_peak_fragmentation_bytes": max(0, peak_res - peak_alloc),
    }


def is_oom(exc: BaseException) -> bool:
    """A CUDA out-of-memory error (torch raises the same type when host memory runs out: not that)."""
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return "CUDA out of memory" in str(exc) or (
        oom is not None and isinstance(exc, oom) and "CUDA" in str(exc)
    )


def save_oom_snapshot(exc: BaseException, out_dir: Path, cuda: Any = None) -> dict[str, Any] | None:
    """On a CUDA OOM: the allocator snapshot next to the report and its largest live allocations."""
    if not is_oom(exc):
        return None
    cuda = cuda or _cuda()
    try:
        snap = cuda.memory._snapshot()
        path = Path(out_dir) / SNAPSHOT
        with open(path, "wb") as f:
            pickle.dump(snap, f)
    except Exception as e:
        return {"error": f"could not take a memory snapshot: {type(e).__name__}: {e}"}
    return {"path": str(path), "largest": largest_allocations(snap)}


def _site(frames: list[dict[str, Any]]) -> str:
    from pitstop.profile.capture.where import is_user_file, location

    for fr in frames:
        if is_user_file(str(fr.get("filename", ""))):
            return location(fr["filename"], int(fr.get("line", 0)))
    if frames:
        return f"{frames[0].get('filename')}:{frames[0].get('line')}"
    return "<no stack recorded>"


def largest_allocations(snapshot: dict[str, Any], n: int = TOP_N) -> list[dict[str, Any]]:
    """Live (allocated) blocks of a ``_snapshot()`` summed by the user ``file:line`` that allocated them."""
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for seg in snapshot.get("segments", []):
        for block in seg.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            row = by_site[_site(block.get("frames") or [])]
            row[0] += int(block.get("requested_size") or block.get("size") or 0)
            row[1] += 1
    rows = [{"location": k, "bytes": v[0], "blocks": v[1]} for k, v in by_site.items()]
    rows.sort(key=lambda r: -r["bytes"])
    return rows[:n]
