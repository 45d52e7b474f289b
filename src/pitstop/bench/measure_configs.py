"""Warm up configs, then time them interleaved through the timing engine (``pitstop.measure.interleave``):
repeat r runs every config's block once, in a rotated order, so drift (thermal, other load on a shared
machine) hits all configs alike. Shared by the main process and the subprocess worker (compile, DDP)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pitstop.bench.configs import BenchConfig
from pitstop.bench.measure import step_memory
from pitstop.bench.rows import FAILED, SKIPPED, Row
from pitstop.bench.session import Session, make_session
from pitstop.bench.workloads import Workload
from pitstop.measure import Arm, Settings, interleave
from pitstop.measure.clock import time_block

Progress = Callable[[str], None]  # called once per unit of work done, with a short description


@dataclass
class ConfigRun:
    """One config being measured: its row of results and, while it runs, its training session."""

    config: BenchConfig
    row: Row
    session: Session | None = None
    estimate_s: float = 0.0  # seconds per step, from the last warm-up step
    extra: dict[str, float] = field(default_factory=dict)


def _fail(live: ConfigRun, stage: str, e: BaseException) -> None:
    live.row.status = FAILED
    live.row.reason = f"{stage} failed: {type(e).__name__}: {e}".strip()[:400]
    live.row.extra["traceback"] = traceback.format_exc(limit=4)[-1500:]
    if live.session is not None:
        live.session.close()
        live.session = None


def new_row(config: BenchConfig) -> Row:
    return Row(config.name, config.title, config.knobs(), claim=config.claim, dtype=config.amp or "float32")


def warm_up(
    workload: Workload,
    configs: list[BenchConfig],
    device: str,
    warmup: int,
    threads: int,
    seed: int = 0,
    progress: Progress | None = None,
    memory: bool = True,
    wrap: Callable[[Session], None] | None = None,
    deadline: float | None = None,
    skip_if: Callable[[BenchConfig, list[ConfigRun]], str | None] | None = None,
) -> list[ConfigRun]:
    """Build each config's session, run ``warmup`` steps (timed one by one), then measure one step's peak
    memory. A config that raises becomes a failed row with the error; the others go on. ``skip_if``
    (config, the lives so far) gives a reason to skip a config before it is built. Past ``deadline`` the
    configs after the first (the reference) are skipped, and warm-up stops early when its next step would
    end past it."""
    torch.set_num_threads(threads)
    out = []
    for config in configs:
        live = ConfigRun(config, new_row(config))
        out.append(live)
        # past the deadline only the first config (the reference) is still warmed up
        if deadline is not None and time.monotonic() > deadline and len(out) > 1:
            live.row.status, live.row.reason = SKIPPED, "the --budget ran out before its warm-up"
            continue
        if skip_if is not None and (reason := skip_if(config, out)):
            live.row.status, live.row.reason = SKIPPED, reason
            continue
        try:
            live.session = make_session(workload, config, device, seed)
            if wrap is not None:
                wrap(live.session)
            live.row.samples_per_step = live.session.samples_per_step
            for _ in range(max(1, warmup)):
                if (
                    live.row.warmup_s
                    and deadline is not None
                    and time.monotonic() + live.row.warmup_s[-1] > deadline
                ):
                    break
                live.row.warmup_s.append(time_block(live.session.step, 1, live.session.sync))
            # The fastest warm-up step after the first (which pays one-off set-up) sizes the blocks.
            live.estimate_s = min(live.row.warmup_s[1:] or live.row.warmup_s)
            failed = live.session.compile_error()
            if failed is not None:  # pitstop.train fell back to eager: this row would not measure compile
                raise RuntimeError(f"torch.compile failed, eager fallback: {failed}")
            if memory and config.peer != "lightning":
                m = step_memory(live.session.step, device)
                live.row.peak_mem_bytes, live.row.activation_bytes = m.peak_bytes, m.activation_bytes
        except KeyboardInterrupt:
            raise
        except Exception as e:  # one broken config must not end the bench
            _fail(live, "warm-up", e)
        if progress:
            progress(f"warm-up {config.name}")
    return out


def calibrate(
    lives: list[ConfigRun], threads: int, progress: Progress | None = None, deadline: float | None = None
) -> None:
    """One untimed 1-step block per config, in the conditions the timed blocks will see (warm-up may have
    shared the CPU with a compiling worker): its time sizes the blocks. Not part of the results. A config
    whose block would end past ``deadline`` keeps its warm-up estimate."""
    for lv in lives:
        if lv.session is None:
            continue
        if deadline is not None and time.monotonic() + 2 * lv.estimate_s > deadline:
            continue
        try:
            lv.estimate_s = lv.session.block(1, threads)
        except KeyboardInterrupt:
            raise
        except Exception as e:
            _fail(lv, "calibration", e)
    if progress:
        progress("calibration")


def time_blocks(
    lives: list[ConfigRun],
    steps: int,
    repeats: int,
    threads: int,
    progress: Progress | None = None,
    before_block: Callable[[], None] | None = None,
    deadline: float | None = None,
    on_round: Callable[[int], None] | None = None,
) -> int:
    """Time ``repeats`` blocks of ``steps`` steps per config in the timing engine's rotating rounds
    (``pitstop.measure.interleave``: each config an arm, the first one warmed up the baseline), so drift
    hits all configs alike. Returns the repeats completed (``on_round`` is told of each). A block
    predicted (from the config's last block) to end past ``deadline`` (time.monotonic()) is not started:
    after the first repeat that ends the timing (the blocks already timed are kept); in the first repeat
    that config, unless it is the baseline, is skipped with that reason instead. The row's verdicts come
    from its blocks later (``rows.derive``), not from the engine's rounds."""
    by_name = {lv.config.name: lv for lv in lives if lv.session is not None}
    if not by_name:
        return 0
    for lv in by_name.values():
        lv.row.steps_per_block = steps
    arms = {name: Arm(name) for name in by_name}
    base, *rest = arms.values()

    def sample(name: str) -> list[float] | None:
        lv, r = by_name[name], len(arms[name].rounds)
        if lv.session is None:
            return None  # failed in an earlier block
        try:
            if before_block:
                before_block()
            lv.row.block_step_s.append(lv.session.block(steps, threads))
            lv.estimate_s = lv.row.block_step_s[-1]  # under the load the next block will see
        except KeyboardInterrupt:
            raise
        except Exception as e:
            _fail(lv, f"repeat {r + 1}", e)
        if progress:
            progress(f"repeat {r + 1}/{repeats} {name}")
        return None if lv.session is None else [lv.estimate_s]

    def fits(name: str) -> bool:
        lv = by_name[name]
        if deadline is None or lv.session is None:
            return True
        return time.monotonic() + lv.estimate_s * (steps + 1) <= deadline

    done = interleave(
        base,
        rest,
        sample,
        Settings.every_round(repeats),  # every config gets every block: no verdict ends one early
        fits=fits,
        on_progress=(lambda p: on_round(p.round)) if on_round else None,
    )
    for name, arm in arms.items():
        lv = by_name[name]
        if arm.left_out and lv.session is not None:
            lv.row.status, lv.row.reason = SKIPPED, "the --budget ran out before its timed blocks"
            lv.session.close()
            lv.session = None
    return done


def close_all(lives: list[ConfigRun]) -> None:
    for lv in lives:
        if lv.session is not None:
            lv.session.close()
            lv.session = None
