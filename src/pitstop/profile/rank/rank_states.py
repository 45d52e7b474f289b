"""The ranks' state files, read by pitstop's own process: ``rank-R/state.json`` (a rank's watchdog keeps it
saying which step the rank is in and which collective it is blocked in, ``pitstop.profile.rank.rank_worker``)
and ``rank-R/heartbeat``, with whether each rank's process is still alive. ``ranks`` watches them while a
launch runs, ``merge`` and ``children_report`` read them when it has ended, a child reads its siblings'.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any

from pitstop.profile.rank import rank_worker as rw

HOST = socket.gethostname()


def read_states(out: Path) -> dict[int, dict[str, Any]]:
    """Each rank's last state record (``rank-R/state.json``), with ``alive`` for ranks on this host."""
    states: dict[int, dict[str, Any]] = {}
    for d in out.glob("rank-*"):
        try:
            st = json.loads((d / rw.STATE).read_text())
        except (OSError, ValueError):
            continue
        # a rank on another node (shared --out-dir) is alive until it writes its final status
        local = st.get("host") in (None, HOST)
        st["alive"] = st.get("status") in (None, "running") and (
            alive(int(st.get("pid", 0))) if local else not st.get("stale")
        )
        with contextlib.suppress(OSError, ValueError):  # newer than the state when the rank died suddenly
            st["collective_step"] = int((d / rw.HEARTBEAT).read_text())
            st["step"] = max(int(st.get("step", 0)), st["collective_step"])  # the 0.2 s sample may lag
        states[int(st["rank"])] = st
    return states


def alive(pid: int) -> bool:
    """The process is running (not gone, not a zombie its parent has yet to reap)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie has ended: its parent (the launcher) has not reaped it
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    return True


def collective_name(cur: dict[str, Any]) -> str:
    """``all_reduce (collective #57, 4 B)``: what a rank waits in, with its number among the collectives the
    rank entered, so ranks blocked in different collectives are told apart."""
    extra = [f"collective #{cur['n']}"] if cur.get("n") else []
    if cur.get("bytes") is not None:
        extra.append(f"{cur['bytes']} B")
    return cur["what"] + (f" ({', '.join(extra)})" if extra else "")
