"""A job whose ranks span nodes, seen whole from every node: states and records shared through the
launcher's store.

Each node runs its own ``pitstop profile -- torchrun --nnodes=N ...``, and without a folder they all write
to (``--out-dir`` on a shared file system) a node's parent sees only its own ranks. What every rank of the
job can reach is the launcher's key-value store: torchrun's c10d ``TCPStore`` at MASTER_ADDR:MASTER_PORT,
which the default process group uses too. Through a connection of its own (it runs beside the script's
collectives, on a thread of pitstop's):

- every rank publishes its state (step, the collective it is blocked in with its number among the
  collectives the rank entered, where its main thread is) once a second, and its final record (the
  measurements, the watchdog's dumps) when it ends;
- each node's local rank 0 copies the other nodes' ranks into its node's run folder as ``rank-R/``, as if
  they were local: their states while the job runs (the parent's hang check, ``ranks.stuck``, then sees a
  rank blocked or behind on another node), their final records when it ends (so every node's report is
  the job's).

A rank folder that its own rank writes to (it holds the rank's ``run-config.json``: a shared
``--out-dir``) is never copied into. Nothing here touches the script's process group: a store client is a
TCP connection to the server the launcher already runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from pitstop.profile.record.measurements import SCHEMA

PREFIX = "pitstop/share"
EVERY_S = 1.0  # between a rank's state updates
STALE_S = 5.0  # a remote rank whose state has not changed for this long (by this node's clock) is silent
# at the end, local rank 0 waits for the other nodes' final records as long as their ranks still publish
# their state (rank 0 may be running its exit probes), up to this long
RECORD_WAIT_S = 120.0
STOPPING_WAIT_S = 3.0  # the same, once this rank is being stopped (Ctrl-C, a hang): the others are too
ACK_WAIT_S = 10.0  # then, how long a node's copier waits for the other nodes' copiers to be done
CONNECT_S = 10.0
RUN_CONFIG = "run-config.json"


def launcher_store(timeout_s: float = CONNECT_S) -> Any:
    """A client of the launcher's store at MASTER_ADDR:MASTER_PORT, on a connection of its own; None
    where there is none to reach."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    try:
        import torch.distributed as dist

        return dist.TCPStore(
            host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )
    except Exception:
        return None


def owned(rank_dir: Path) -> bool:
    """The rank writes this folder itself (a folder every node shares): nothing is copied into it."""
    return (rank_dir / RUN_CONFIG).exists()


class Shared:
    """One rank's side of the sharing: ``publish_state``/``publish_record`` for every rank,
    ``copy_states``/``copy_records`` for the node's local rank 0."""

    def __init__(self, job: str, rank: int, world: int, node: int, out_root: Path, store: Any = None) -> None:
        self.job, self.rank, self.world, self.node = job, rank, world, node
        self.out_root = Path(out_root)
        self._store = store
        self._connected = store is not None
        # rank -> (its last state's text, when this node first saw that text)
        self._seen: dict[int, tuple[bytes, float]] = {}
        self._nodes: dict[int, int] = {}  # rank -> node, from its states

    def _key(self, kind: str, rank: int) -> str:
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return f"{PREFIX}/{self.job}/{restart}/{kind}/{rank}"

    def store(self) -> Any:
        if not self._connected:
            self._connected = True  # once: a store that cannot be reached is not retried every second
            self._store = launcher_store()
        return self._store

    def publish_state(self, state: dict[str, Any]) -> None:
        store = self.store()
        if store is not None:
            store.set(self._key("state", self.rank), json.dumps(state).encode())

    def publish_record(self, bundle: dict[str, Any]) -> None:
        """The rank's final record (``measurements``, ``watchdog``, ``state``) for the other nodes."""
        from pitstop.findings import jsonable

        store = self.store()
        if store is not None:
            store.set(self._key("record", self.rank), json.dumps(jsonable(bundle), allow_nan=False).encode())

    def _remote(self, rank: int) -> bool:
        return rank != self.rank and self._nodes.get(rank) != self.node and not owned(self._dir(rank))

    def _dir(self, rank: int) -> Path:
        return self.out_root / f"rank-{rank}"

    def copy_states(self, now: float | None = None) -> None:
        """The other nodes' ranks' latest states into this node's run folder (``rank-R/state.json``); a rank
        whose state has not changed for STALE_S is marked ``stale`` (its node may be gone)."""
        from pitstop.profile.record.jsonfile import write_json_atomic

        store = self.store()
        if store is None:
            return
        now = time.monotonic() if now is None else now
        for r in range(self.world):
            if r == self.rank or self._nodes.get(r) == self.node:
                continue
            key = self._key("state", r)
            with contextlib.suppress(Exception):
                if not store.check([key]):
                    continue
                raw = store.get(key)
                st = json.loads(raw)
                self._nodes[r] = int(st.get("node", -1))
                if not self._remote(r):
                    continue
                last = self._seen.get(r)
                if last is None or last[0] != raw:
                    self._seen[r] = last = (raw, now)
                st["remote"] = True
                st["stale"] = now - last[1] > STALE_S
                self._dir(r).mkdir(parents=True, exist_ok=True)
                write_json_atomic(self._dir(r) / "state.json", st)

    def copy_records(self, wait_s: float = RECORD_WAIT_S, stop: Any = None) -> list[int]:
        """Wait for the other nodes' ranks' final records and write each into this node's run folder: up to
        ``wait_s``, no longer once every rank still missing has gone silent for STALE_S, and STOPPING_WAIT_S more
        once ``stop()`` says this rank is being stopped. Returns the ranks whose record did not come."""
        from pitstop.profile.record.jsonfile import write_json_atomic

        store = self.store()
        if store is None:
            return []
        self.copy_states()
        remote = {r for r in range(self.world) if self._remote(r)}
        pending = set(remote)
        start = time.monotonic()
        deadline = start + wait_s
        while pending:
            for r in sorted(pending):
                key = self._key("record", r)
                with contextlib.suppress(Exception):
                    if not store.check([key]):
                        continue
                    bundle = json.loads(store.get(key))
                    pending.discard(r)
                    d = self._dir(r)
                    d.mkdir(parents=True, exist_ok=True)
                    if bundle.get("watchdog"):
                        write_json_atomic(d / "watchdog.json", bundle["watchdog"])
                    write_json_atomic(d / "measurements.json", bundle["measurements"])
                    write_json_atomic(d / "state.json", {**bundle.get("state", {}), "remote": True})
            if stop is not None and stop():  # being stopped: the other nodes are too, give them a moment
                deadline = min(deadline, time.monotonic() + STOPPING_WAIT_S)
                stop = None
            if not pending or time.monotonic() > deadline:
                break
            self.copy_states()
            now = time.monotonic()
            # a rank never seen at all counts as silent once STALE_S has passed here
            if all(now - self._seen.get(r, (b"", start))[1] > STALE_S for r in pending):
                break  # every rank still missing stopped publishing: its record is not coming
            time.sleep(0.1)
        for r in pending:
            self._note_missing(r)
        # the nodes whose records came are alive and copy too
        self._done_copying(
            store, stop, {self.node, *(self._nodes.get(r, -1) for r in remote - pending)} - {-1}
        )
        return sorted(pending)

    def _done_copying(self, store: Any, stop: Any, nodes: set[int]) -> None:
        """Say this node has its copies, then wait (up to ACK_WAIT_S) until the other live ``nodes`` have said
        so. The store lives in one process of the job (one node's launcher, or rank 0 itself under srun) and
        goes when it ends: no node's copier may leave while another still reads from it."""
        key = f"{PREFIX}/{self.job}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/copied"
        deadline = time.monotonic() + ACK_WAIT_S
        with contextlib.suppress(Exception):
            done = store.add(key, 1)
            while done < len(nodes) and time.monotonic() < deadline and not (stop is not None and stop()):
                time.sleep(0.05)
                done = store.add(key, 0)

    def _note_missing(self, rank: int) -> None:
        """A rank of another node whose final record never came: a record that says so, with its last state."""
        from pitstop.profile.record.jsonfile import write_json_atomic

        d = self._dir(rank)
        d.mkdir(parents=True, exist_ok=True)
        try:
            st = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            st = {"rank": rank}
        host = st.get("host") or "another node"
        record = {
            "version": 1,
            "schema": SCHEMA,
            "status": "killed",
            "steps": [],
            "remote_missing": True,
            "error": f"no final record came from rank {rank} on {host} (last seen at step {st.get('step', '?')}); "
            "that node's own report has what it measured",
            "distributed": {
                "rank": rank,
                "hostname": st.get("host"),
                "node_rank": st.get("node"),
                "world_size": self.world,
                "state": st,
            },
        }
        write_json_atomic(d / "measurements.json", record)
        write_json_atomic(d / "state.json", {**st, "status": "killed", "remote": True, "stale": True})
