"""How fast square ``torch.mm`` runs here in a dtype, measured within a time bound whatever the hardware.

On a CPU without bf16 instructions oneDNN emulates bf16: one 2048x2048 bf16 mm took 57 s on an AVX2-only
EPYC. So every measurement here times one call at a small size first, predicts each larger size from the
largest one timed (time grows as n^3), and skips a size whose predicted cost does not fit what is left of
its budget, naming it in ``Peak.skipped`` and ``Peak.note``. bench's peaks, profile's amp probe, fix's
autocast candidate and doctor's ``cpu.bf16`` all measure through ``matmul_peak`` / ``low_precision``.
torch is imported when a measurement runs, so doctor can import this without it.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pitstop.host.cpu import FAST_BF16_FLAGS, cpu_has_fast_bf16

PROBE_N = 256  # first size timed on a CPU: ~34 MFLOP, a fraction of a second even emulated
SAFETY = 2.0  # a prediction must fit this many times over (large sizes often run slower: cache, emulation)
PEAK_BUDGET_S = 10.0  # default bound of one matmul_peak call
CHECK_BUDGET_S = 1.5  # default bound of one low_precision check (fp32 and the dtype together)
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

if TYPE_CHECKING:
    import torch


@dataclass
class Peak:
    dtype: str
    n: int  # the matrix size that was fastest
    flops_per_s: float
    seconds: float  # fastest time of one torch.mm at that size
    skipped: tuple[int, ...] = ()  # sizes asked for that did not fit the time bound
    note: str = ""  # how the bound shaped the measurement, in words ('' when every size was timed)
    spent_s: float = 0.0  # seconds of torch.mm this measurement ran (warm-up calls included)
    timed: tuple[int, ...] = field(default=())  # sizes measured, smallest first


def _operands(n: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    return torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)


def _timed(a: torch.Tensor, b: torch.Tensor, number: int) -> float:
    """Seconds per call of ``torch.mm(a, b)`` over one block of ``number`` calls (CUDA synchronised)."""
    import torch

    from pitstop.torchbench import torch_benchmark

    timer = torch_benchmark().Timer(
        "torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b}, num_threads=torch.get_num_threads()
    )
    return timer.timeit(number).mean


def _gflops(flops_per_s: float) -> str:
    return f"{flops_per_s / 1e9:.3g} GFLOP/s"


def matmul_peak(
    dtype: str,
    device: str = "cpu",
    sizes: tuple[int, ...] | None = None,
    min_run_time: float = 0.3,
    budget_s: float = PEAK_BUDGET_S,
) -> Peak:
    """FLOP/s of square ``torch.mm``: the practical compute ceiling. A ceiling, so the fastest block over
    the sizes counts (other load on the machine only ever makes a block slower).

    Bounded by ``budget_s`` (of torch.mm time, warm-up calls included; at most a prediction's error over
    it): on a CPU the sizes are preceded by ``PROBE_N`` (and twice that) so a slow dtype is found on a
    cheap call; each size is predicted from the largest one timed and skipped when it would not fit.
    Raises RuntimeError when the dtype cannot run on the device at all.
    """
    asked = tuple(sorted(set(sizes or ((4096, 8192) if device == "cuda" else (1024, 2048)))))
    ladder = sorted({n for n in (PROBE_N, 2 * PROBE_N) if n < asked[0]} | set(asked))
    import torch

    dt = getattr(torch, dtype)
    start = time.monotonic()
    spent = 0.0  # torch.mm seconds as measured (a faked clock in tests moves only this)
    best: Peak | None = None
    timed: list[int] = []
    skipped: list[int] = []
    per_call: tuple[int, float] | None = None  # (n, seconds) of the largest size timed

    def left() -> float:
        return budget_s - max(spent, time.monotonic() - start)

    for n in ladder:
        predicted = per_call[1] * (n / per_call[0]) ** 3 if per_call else 0.0
        # The first size always runs (one small call); a later one needs its first call to fit.
        if per_call and SAFETY * predicted > left():
            skipped += [m for m in ladder if m >= n and m in asked]
            break
        a, b = _operands(n, dt, device)
        first = _timed(a, b, 1)  # warm-up (oneDNN / cuBLAS kernel selection), and a first estimate
        spent += first
        blocks: list[float] = []
        run_time = min_run_time if n in asked else 0.1 * min_run_time  # probe sizes: a short look
        number = max(1, int(0.1 * run_time / max(first, 1e-9)))
        while number * sum(blocks) < run_time and SAFETY * number * min(blocks or [first]) <= left():
            blocks.append(_timed(a, b, number))
            spent += blocks[-1] * number
        t = min(blocks or [first])  # the warm-up call counts only when nothing else fitted
        per_call = (n, t)
        timed.append(n)
        rate = 2 * n**3 / t
        if best is None or rate > best.flops_per_s:
            best = Peak(dtype, n, rate, t)
    assert best is not None
    best.skipped, best.spent_s, best.timed = tuple(skipped), spent, tuple(timed)
    if skipped:
        best.note = (
            f"{SHORT.get(dtype, dtype)} torch.mm: {_gflops(best.flops_per_s)}{emulated_note(dtype, device)}; "
            f"skipped n={', '.join(map(str, skipped))} (predicted over the {budget_s:.0f} s bound)"
        )
    return best


def emulated_note(dtype: str, device: str) -> str:
    """', emulated on this CPU' for bf16 on a CPU without bf16 instructions, else ''."""
    return (
        ", emulated on this CPU"
        if device == "cpu" and dtype == "bfloat16" and not cpu_has_fast_bf16()
        else ""
    )


@dataclass
class LowPrecision:
    """A low-precision dtype's torch.mm speed against fp32's, measured side by side at the same sizes."""

    dtype: str
    device: str
    peak: Peak
    fp32: Peak

    @property
    def slowdown(self) -> float:
        """fp32 FLOP/s over the dtype's (above 1: the dtype is slower here)."""
        return self.fp32.flops_per_s / self.peak.flops_per_s

    @property
    def slower(self) -> bool:
        return self.slowdown > 1.0

    def summary(self) -> str:
        """'bf16 torch.mm 29 GFLOP/s vs fp32 77 GFLOP/s (2.7x slower)', measured at the sizes named."""
        s = self.slowdown
        cmp = f"{s:.2g}x slower" if s > 1 else f"{1 / s:.2g}x faster"
        return (
            f"{SHORT.get(self.dtype, self.dtype)} torch.mm {_gflops(self.peak.flops_per_s)} vs fp32 "
            f"{_gflops(self.fp32.flops_per_s)} ({cmp}; n={self.peak.n}, measured)"
        )


def low_precision(
    dtype: str = "bfloat16", device: str = "cpu", budget_s: float = CHECK_BUDGET_S, n: int = 2 * PROBE_N
) -> LowPrecision:
    """How fast ``dtype`` matmuls run here against fp32, within ``budget_s`` in all (half each): the
    check profile, fix and doctor make before running anything in that dtype. Sizes ``PROBE_N`` and ``n``."""
    sizes = tuple(sorted({min(PROBE_N, n), n}))
    fp32 = matmul_peak("float32", device, sizes, min_run_time=0.05, budget_s=budget_s / 2)
    peak = matmul_peak(dtype, device, sizes, min_run_time=0.05, budget_s=budget_s - fp32.spent_s)
    return LowPrecision(dtype, device, peak, fp32)


@functools.cache
def cpu_bf16_check() -> LowPrecision:
    """bf16 torch.mm against fp32 on this CPU, measured once per process: ``pitstop.train``'s ``auto``
    precision confirms with it what the CPU's flags promise. The flags tell what the CPU has, not what
    oneDNN runs: under ``ONEDNN_MAX_CPU_ISA=AVX2`` (or a build without the bf16 kernels) an AVX512_BF16 EPYC
    ran bf16 torch.mm at 2.3 GFLOP/s against fp32's 157 (n=512), and the benchmark conv net's bf16 step
    8.8x slower than fp32's (``benchmarks/results/train_levers.md``). ``low_precision`` twice, at one
    thread, keeping each dtype's fastest (other load only ever slows a block): on a loaded 2-core
    machine one 2-thread check timed fp32 at 1.7 GFLOP/s (OpenMP waiting on a preempted thread) and
    emulated bf16 looked faster."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the ratio is the core's; one thread has no barrier to stall on
    try:
        a, b = low_precision("bfloat16", "cpu"), low_precision("bfloat16", "cpu")
    finally:
        torch.set_num_threads(threads)
    return LowPrecision(
        "bfloat16",
        "cpu",
        max(a.peak, b.peak, key=lambda p: p.flops_per_s),
        max(a.fp32, b.fp32, key=lambda p: p.flops_per_s),
    )


def fast_amp_dtype(device_type: str) -> str | None:
    """The autocast dtype this device is fast at (``pitstop.host.precision.preferred_amp_dtype``), where a
    CPU's bf16 flags are confirmed by ``cpu_bf16_check``: None (stay fp32) where its bf16 measured slower.
    ``pitstop.train``'s auto precision, bench's AMP rows and fix's amp candidate choose by it."""
    from pitstop.host.precision import preferred_amp_dtype

    name = preferred_amp_dtype(device_type)
    if name == "bfloat16" and device_type == "cpu" and cpu_bf16_check().slower:
        return None  # bf16 flags, but emulated kernels (an ISA cap, a build without them)
    return name


def slower_reason(dtype: str, device: str) -> str | None:
    """Why running ``dtype`` here cannot be faster than fp32 (its torch.mm measured slower, in a bounded
    check; a CPU's bf16 by ``cpu_bf16_check``, measured once per process, so ``fast_amp_dtype`` and this
    reason share one measurement), or None when it measured as fast or faster."""
    lp = cpu_bf16_check() if (dtype, device) == ("bfloat16", "cpu") else low_precision(dtype, device)
    if not lp.slower:
        return None
    return f"{lp.summary()}{emulated_note(dtype, device)}: autocast cannot make this {device} faster"


def predicted_s(fp32_s: float, fp32_rate: float, rate: float) -> float:
    """Worst-case seconds of work that took ``fp32_s`` in fp32, if all of it ran at the dtype's matmul
    rate (a step is never more matmul-bound than a matmul)."""
    return fp32_s * max(1.0, fp32_rate / rate) if rate > 0 else math.inf


def cpu_bf16_line(flags: frozenset[str] | None = None, check: LowPrecision | None = None) -> str:
    """One sentence on bf16 on this CPU, the same in doctor and bench: the flags, and the measurement."""
    fast = cpu_has_fast_bf16(flags)
    base = (
        "bf16 hardware on this CPU"
        if fast
        else f"no bf16 hardware on this CPU (none of {', '.join(FAST_BF16_FLAGS)} in its flags): "
        "bf16 is emulated, keep fp32 on the CPU"
    )
    return base + (f"; {check.summary()}" if check is not None else "")
