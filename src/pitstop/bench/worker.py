"""Subprocess side of `pitstop bench`: measures configs that need their own process.

- torch.compile rows: compiling can take minutes on a small CPU, so they run here under a timeout, with
  their own baseline timed interleaved in the same process (their ratio is against that baseline).
- DDP: launched by ``python -m torch.distributed.run``; every rank wraps the model in
  DistributedDataParallel (gloo on CPU, NCCL on CUDA) and rank 0 writes the times.

Usage: ``python -m pitstop.bench.worker SPEC.json OUT.json``. OUT is rewritten after every phase so a
run killed by its timeout still leaves what it measured. With ``go_file`` in the spec the worker warms
up, reports phase "ready" and waits for that file (``{"steps": n}``) before timing (see subproc.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pitstop.bench.configs import BenchConfig, Claim


def config_from_dict(d: dict[str, Any]) -> BenchConfig:
    d = dict(d)
    if d.get("claim"):
        d["claim"] = Claim(**d["claim"])
    return BenchConfig(**d)


def _write(path: Path, payload: dict[str, Any]) -> None:
    from pitstop.report.jsonfmt import atomic_write_text

    atomic_write_text(path, json.dumps(payload))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])

    from pitstop.bench.measure_configs import close_all, time_blocks, warm_up
    from pitstop.bench.workloads import WorkloadSpec, build_workload

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = spec["device"]
    wrap = None
    barrier = None
    if world > 1:
        from pitstop.train import init_distributed, wrap_ddp
        from pitstop.train.distributed import barrier

        env = init_distributed(device)  # gloo on CPU, NCCL on CUDA (pitstop.train's recipe)
        device = env.device.type

        def wrap(session: Any) -> None:
            session.forward = wrap_ddp(session.model, env)

    workload = build_workload(WorkloadSpec(**spec["workload"]))
    configs = [config_from_dict(c) for c in spec["configs"]]
    payload: dict[str, Any] = {"world_size": world, "rows": {}, "done": False, "phase": "warm-up"}

    def dump(lives: list[Any]) -> None:
        if rank == 0:
            payload["rows"] = {lv.config.name: lv.row.to_dict() for lv in lives}
            _write(out, payload)

    if rank == 0:
        _write(out, payload)
    lives = warm_up(
        workload,
        configs,
        device,
        spec["warmup"],
        spec["threads"],
        seed=spec.get("seed", 0) + rank * 1000,
        memory=spec.get("memory", True) and world == 1,
        wrap=wrap,
    )
    steps = spec.get("steps", 1)
    if spec.get("go_file"):  # held: wait for the parent's go (it is not timing anything then)
        payload["phase"] = "ready"
        dump(lives)
        go = Path(spec["go_file"])
        while not go.exists():
            time.sleep(0.1)
        steps = int(json.loads(go.read_text())["steps"])
    payload["phase"] = "timing"
    dump(lives)

    def repeat_done(r: int) -> None:
        payload["phase"] = f"repeat {r}"
        dump(lives)

    time_blocks(lives, steps, spec["repeats"], spec["threads"], before_block=barrier, on_round=repeat_done)
    payload["done"] = True
    dump(lives)
    close_all(lives)
    if world > 1:
        from pitstop.train import cleanup

        cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
