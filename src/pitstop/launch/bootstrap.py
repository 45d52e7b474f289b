"""Run by torchrun in each local rank: bind to this rank's CPUs, set its thread count, run the script.

``python -m pitstop.launch.bootstrap train.py ARGS`` (or ``-m module ARGS``). The CPUs come from
PITSTOP_RANK_CPUS (``0-3;4-7``, indexed by LOCAL_RANK) set by ``pitstop launch``. This runs before the
script imports torch, so the OpenMP runtime reads the thread settings when it loads.
"""

from __future__ import annotations

import os
import runpy
import sys

from pitstop.launch.binding import slot_from_env, thread_env


def bind_rank(environ: dict[str, str] | os._Environ[str] = os.environ) -> list[int] | None:
    """Apply this rank's slot to the current process; returns the CPUs bound, or None."""
    local_rank = int(environ.get("LOCAL_RANK", "0"))
    try:
        cpus = slot_from_env(environ, local_rank)
    except ValueError:
        cpus = None
    if not cpus:
        return None
    if environ.get("PITSTOP_BIND", "1") == "1":
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:
            print(f"pitstop: rank {local_rank}: cannot bind to CPUs {cpus}: {e}", file=sys.stderr)
            return None
        environ.update(thread_env(cpus))
    else:
        environ.update({k: str(len(cpus)) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    return cpus


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit("usage: python -m pitstop.launch.bootstrap train.py ARGS | -m module ARGS")
    bind_rank()
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
