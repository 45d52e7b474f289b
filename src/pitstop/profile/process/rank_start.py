"""A rank's start: the ``sitecustomize`` that ``pitstop profile`` puts on PYTHONPATH around a launcher
(``pitstop/profile/process/rankhook``) calls ``activate()`` at interpreter start-up of every process the launcher
starts. In a worker (RANK set, not the launcher, not a process the worker started itself) it writes the
rank's run config, adds the rank's ``RankWorker`` (``pitstop.profile.rank.rank_worker``) to the run's extension
points and runs the script through ``pitstop.profile.process.bootstrap`` exactly as a single-process profile does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pitstop.profile.process.command import CommandError, parse_command
from pitstop.profile.rank.rank_worker import (
    ENV_CONFIG,
    ENV_LAUNCHER_PID,
    ENV_PARENT,
    ENV_RANK_PID,
    ENV_SELF_RANK,
    RankWorker,
    identity,
    rank_dir,
)


def activate() -> None:
    """Called at start-up of every Python process under the launcher; acts only in its workers: processes
    with RANK set, or started by the launcher itself (``accelerate launch`` of one process sets no RANK)."""
    ppid = str(os.getppid())
    if os.environ.get(ENV_RANK_PID):
        return  # a process a rank started (spawned loader workers, compile workers)
    if os.environ.get(ENV_PARENT) == ppid and not os.environ.get(ENV_SELF_RANK):
        os.environ[ENV_LAUNCHER_PID] = str(os.getpid())  # the launcher itself: runs untouched
        return
    if (
        "RANK" not in os.environ
        and os.environ.get(ENV_LAUNCHER_PID) != ppid
        and not (os.environ.get(ENV_SELF_RANK) and os.environ.get(ENV_PARENT) == ppid)
    ):
        return
    try:
        cfg = json.loads(Path(os.environ[ENV_CONFIG]).read_text())
        ident = identity()
        kind, target, args = parse_command(list(getattr(sys, "orig_argv", [])))
    except (CommandError, OSError, ValueError, KeyError):
        return  # python -c ..., or not a script: leave the process alone
    os.environ[ENV_RANK_PID] = str(os.getpid())
    out = rank_dir(Path(cfg["out_dir"]), ident.rank)
    out.mkdir(parents=True, exist_ok=True)
    run_cfg = {
        **{k: cfg[k] for k in ("steps", "warmup", "full", "trace")},
        "kind": kind,
        "target": target,
        "args": args,
        "overrides": cfg.get("overrides") or {},
        "callback": None,
        "callback_at": "loader",
        "out_dir": str(out.resolve()),
        # rank 0 alone, after every rank stopped, on a copy outside DDP: a probe never communicates
        "probes": bool(cfg.get("probes", True)) and ident.rank == 0,
    }
    path = out / "run-config.json"
    path.write_text(json.dumps(run_cfg))
    from pitstop.profile.process import bootstrap, instrumented

    worker = RankWorker(ident, out)
    worker.stop_timeout_s = float(cfg.get("timeout") or worker.stop_timeout_s)
    instrumented.ON_INSTALL.append(worker.on_install)
    instrumented.ON_FINISH.append(worker.on_finish)
    instrumented.ON_END.append(worker.on_end)
    instrumented.ON_PROBES.append(worker.probe_model)
    sys.path.insert(0, "")  # the bootstrap sets sys.path[0] to the script's folder, as python would
    bootstrap.main([str(path)])  # never returns: the bootstrap ends the process with the script's code
