"""pitstop.train vs a naive loop, PyTorch Lightning and HF Accelerate: same conv net, same data, one run.

Contenders (each in its own worker process, so allocator state, imports and peak memory stay apart):

  naive               the tutorial loop: fp32, default memory format, AdamW (for-loop), zero_grad(),
                      loss.item() every step
  naive+glibc         the same unmodified loop started with the environment `pitstop launch
                      --allocator glibc` sets (glibc malloc keeps freed blocks mapped): the zero-code route
  pitstop             pitstop.train.fit with TrainConfig() defaults (auto: bf16 where the CPU is fast at
                      it, fused AdamW, channels_last for conv nets with NHWC gradients kept at global
                      pooling, freed host memory kept mapped, no per-step host sync, compile only where the steps left pay for it: its decision is
                      stated below the table)
  pitstop-nokeep      the same with keep_host_memory=False (glibc malloc as it comes)
  pitstop-nocl        the same with channels_last=False
  pitstop+compile     the same with compile=True (torch.compile, inductor); its compilation runs in the
                      warm-up chunk, whose time is stated beside the table
  pitstop-long        TrainConfig() defaults in a run fit is told is long (max_steps=--long-steps, about
                      an hour here), stopped after the benchmark's chunks: compile='auto' then runs its
                      measured trial (compile, interleaved eager/compiled blocks, keep the faster); the
                      trial and the compilation fall in the warm-up chunks (--warmup-chunks), their time
                      is stated beside the table, and the decision below it
  lightning           Lightning Trainer with its documented speed setting precision="bf16-mixed" (on a
                      CPU where bf16 measures slower than fp32: "32-true", see --peer-precision),
                      logger/checkpointing/progress bar off, AdamW as a user writes it
  accelerate          Accelerator(mixed_precision="bf16") (there: "no"), AdamW as a user writes it
  lightning+fused     lightning with the same fused AdamW pitstop picks
  accelerate+fused    accelerate with the same fused AdamW pitstop picks

The "+fused" rows separate framework overhead from the optimizer choice pitstop makes by default; the
"pitstop-" rows take one of pitstop's defaults away, to show what each is worth here.
Every worker trains the same model from the same seed on the same in-memory data. The parent lets the
workers run one chunk of steps at a time, round-robin (the order rotates every round), so all of them
see the same machine conditions; the first ``--warmup-chunks`` chunks (default 1) are warm-up and not
counted. steps/s per chunk is
measured inside the worker (perf_counter, CPU work is synchronous); we report median and best over chunks.
Each goal's verdict follows the 95% interval of the speed-up over rounds (each round's pair of chunks is
one paired sample, ``pitstop.measure.speedup_interval``): met when the interval lies at or above the goal,
not met when below it, undecided when it holds the goal.
Peak memory is each worker's peak RSS (getrusage) and its growth during training; page faults are the
worker's minor faults per counted step (what glibc's mmap/munmap of the step's tensors costs).
Writes benchmarks/results/train_vs_peers.md where pitstop's ``auto`` precision picks bf16 (bf16 hardware,
measured fast), and benchmarks/results/train_vs_peers_nobf16.md on a CPU without it, so each CPU kind keeps
its own figures.

A CPU without bf16 hardware, emulated on one with it: ``--emulate-isa avx2`` re-runs the benchmark with
``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's ISA cap: no AVX-512 and no bf16 kernels; bf16 is then emulated, as
on an AVX2-only CPU) and ``ATEN_CPU_CAPABILITY=avx2`` (ATen's vectorized kernels at AVX2), which every
worker inherits; the results file's machine line says so, and it is written to
benchmarks/results/train_vs_peers_avx2_emulated.md unless ``--out`` names another.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/train_vs_peers.py [--chunks 30] [--steps 5]
        [--emulate-isa avx2]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from pitstop.measure import Interval, speedup_interval  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "train_vs_peers.md"
RESULTS_NO_BF16 = ROOT / "benchmarks" / "results" / "train_vs_peers_nobf16.md"
RESULTS_EMULATED = ROOT / "benchmarks" / "results" / "train_vs_peers_{isa}_emulated.md"
# the environment that makes this CPU run as one without the ISA named (``--emulate-isa``): oneDNN's cap
# and ATen's kernel level, both read once when torch loads
EMULATE = {"avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}}
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")
CONTENDERS = (
    "naive",
    "pitstop",
    "lightning",
    "accelerate",
    "lightning+fused",
    "accelerate+fused",
    "pitstop-nokeep",
    "pitstop-nocl",
    "naive+glibc",
    "pitstop+compile",
    "pitstop-long",
)
TAG = "@@pitstop-bench "


# ----------------------------------------------------------------------------------------------- worker
def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class _Stop(KeyboardInterrupt):
    """Ends pitstop-long's fit once the benchmark's chunks are done: fit stops at it as at Ctrl-C, cleanly,
    and returns what it applied (its compile decision included)."""


class Handshake:
    """Worker side: announce each finished chunk with its time, then wait for the parent's go."""

    def __init__(self, steps_per_chunk: int, chunks: int) -> None:
        self.steps_per_chunk, self.chunks = steps_per_chunk, chunks
        self.t0 = 0.0
        self.faults0 = 0
        self.done = 0

    def send(self, msg: dict[str, Any]) -> None:
        sys.__stdout__.write(TAG + json.dumps(msg) + "\n")
        sys.__stdout__.flush()

    def wait_go(self) -> None:
        if sys.stdin.readline().strip() != "go":
            raise SystemExit(0)  # parent gone or stopping
        self.faults0 = _minor_faults()
        self.t0 = time.perf_counter()

    def chunk_done(self) -> None:
        dt_s = time.perf_counter() - self.t0
        faults = _minor_faults() - self.faults0
        self.done += 1
        self.send({"chunk": self.done, "seconds": dt_s, "steps": self.steps_per_chunk, "faults": faults})
        if self.done < self.chunks:
            self.wait_go()


def build(seed: int, n_samples: int, batch: int, size: int, w: int) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_samples, 3, size, size, generator=g)
    y = torch.randint(0, 10, (n_samples,), generator=g)

    def block(cin: int, cout: int, stride: int) -> list[torch.nn.Module]:
        return [
            torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            torch.nn.BatchNorm2d(cout),
            torch.nn.ReLU(),
        ]

    model = torch.nn.Sequential(
        *block(3, w, 1),
        *block(w, 2 * w, 2),
        *block(2 * w, 2 * w, 1),
        *block(2 * w, 4 * w, 2),
        *block(4 * w, 4 * w, 1),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * w, 10),
    )
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=True, drop_last=True, generator=g
    )
    return model, loader


def worker(name: str, a: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    if a.threads:
        torch.set_num_threads(a.threads)
    model, loader = build(0, a.samples, a.batch, a.size, a.width)
    total = a.steps * a.chunks
    lr = 1e-3
    hs = Handshake(a.steps, a.chunks)
    base_rss = _rss_mib()
    hs.send({"ready": True, "threads": torch.get_num_threads()})
    hs.wait_go()
    fused = name.endswith("+fused")
    info: dict[str, Any] = {}  # what the contender reports beside its timings (pitstop: its compile decision)

    if name.startswith("naive"):
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        model.train()
        step = 0
        while step < total:
            for x, y in loader:
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                _ = loss.item()  # the usual per-step logging read
                step += 1
                if step % a.steps == 0:
                    hs.chunk_done()
                if step >= total:
                    break
    elif name.startswith("pitstop"):
        from pitstop.train import TrainConfig, fit

        long_run = name == "pitstop-long"
        planned = a.long_steps if long_run else total
        cfg = TrainConfig(epochs=10**6, max_steps=planned, lr=lr, log_every=a.steps, progress=False)
        if name == "pitstop-nokeep":
            cfg.keep_host_memory = False
        if name == "pitstop-nocl":
            cfg.channels_last = False
        if name == "pitstop+compile":
            cfg.compile = True
        def on_log(row: dict[str, float]) -> None:
            if row["step"] % a.steps == 0:
                hs.chunk_done()
            if long_run and row["step"] >= total:
                raise _Stop  # the benchmark's chunks are done; fit was told of a longer run

        res = fit(model, None, loader, F.cross_entropy, cfg, on_log=on_log)
        info["compile"] = res.applied.get("compile")
    elif name.startswith("lightning"):
        import lightning.pytorch as pl

        class Module(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def training_step(self, batch: Any, batch_idx: int) -> Any:
                x, y = batch
                return F.cross_entropy(self.model(x), y)

            def configure_optimizers(self) -> Any:
                return torch.optim.AdamW(self.parameters(), lr=lr, fused=True if fused else None)

        pl_precision = "bf16-mixed" if a.peer_precision == "bf16" else "32-true"

        class Chunks(pl.Callback):
            def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
                if trainer.global_step % a.steps == 0:
                    hs.chunk_done()

        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            precision=pl_precision,
            max_steps=total,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[Chunks()],
        )
        trainer.fit(Module(), train_dataloaders=loader)
    elif name.startswith("accelerate"):
        from accelerate import Accelerator

        acc = Accelerator(cpu=True, mixed_precision="bf16" if a.peer_precision == "bf16" else "no")
        opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True if fused else None)
        model, opt, dl = acc.prepare(model, opt, loader)
        model.train()
        step = 0
        while step < total:
            for x, y in dl:
                loss = F.cross_entropy(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
                step += 1
                if step % a.steps == 0:
                    hs.chunk_done()
                if step >= total:
                    break
    else:
        raise SystemExit(f"unknown contender {name}")
    hs.send({"finished": True, "peak_rss_mib": _peak_rss_mib(), "base_rss_mib": base_rss, **info})


# ----------------------------------------------------------------------------------------------- parent
class Worker:
    def __init__(self, name: str, a: argparse.Namespace) -> None:
        self.name = name
        cmd = [sys.executable, __file__, "--worker", name]
        cmd += ["--steps", str(a.steps), "--chunks", str(a.chunks), "--batch", str(a.batch)]
        cmd += ["--size", str(a.size), "--samples", str(a.samples), "--width", str(a.width)]
        cmd += ["--threads", str(a.threads), "--peer-precision", a.peer_precision]
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
        if name == "naive+glibc":  # what `pitstop launch --allocator glibc` adds to the child's environment
            from pitstop.launch.allocator import preload_env, resolve_allocator

            glibc, _ = resolve_allocator("glibc")
            assert glibc is not None
            env.update(preload_env(glibc, env))
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.chunk_s: list[float] = []
        self.warmup_s = 0.0  # the first chunk: allocations, primitive caches, compilation
        self.faults: list[int] = []
        self.info: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise RuntimeError(f"{self.name} worker exited: {err[-2000:]}")
            if line.startswith(TAG):
                return json.loads(line[len(TAG) :])

    def go(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run(a: argparse.Namespace) -> dict[str, Worker]:
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    workers: dict[str, Worker] = {}
    try:
        for name in a.contenders:
            w = Worker(name, a)
            w.info.update(w.read())  # ready: model and data built, imports done
            workers[name] = w
        names = list(workers)
        with Progress(console=console) as prog:
            task = prog.add_task("chunks", total=a.chunks * len(names))
            for r in range(a.chunks):
                order = names[r % len(names) :] + names[: r % len(names)]  # rotate: no fixed position bias
                for name in order:
                    w = workers[name]
                    msg = w.go()
                    if r < a.warmup_chunks:
                        w.warmup_s += msg["seconds"]
                    else:  # warm-up: first-iteration allocations, oneDNN primitive caches, compilation
                        w.chunk_s.append(msg["seconds"] / msg["steps"])
                        w.faults.append(msg["faults"] / msg["steps"])
                    prog.advance(task)
        for w in workers.values():
            w.info.update(w.read())
    except KeyboardInterrupt:
        console.print("interrupted: reporting the chunks measured so far")
    finally:
        for w in workers.values():
            w.close()
    return workers


def fmt_table(workers: dict[str, Worker], a: argparse.Namespace) -> list[str]:
    med = {n: 1.0 / statistics.median(w.chunk_s) for n, w in workers.items() if w.chunk_s}
    rows = [
        "| contender | median steps/s | best steps/s | vs naive | vs pitstop | page faults/step | "
        "peak RSS MiB | RSS growth MiB | chunks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, w in workers.items():
        if not w.chunk_s:
            continue
        best = 1.0 / min(w.chunk_s)
        vs_naive = f"{med[n] / med['naive']:.2f}x" if "naive" in med else "-"
        vs_pit = f"{med[n] / med['pitstop']:.2f}x" if "pitstop" in med else "-"
        faults = f"{statistics.median(w.faults):.0f}" if w.faults else "-"
        peak = w.info.get("peak_rss_mib")
        base = w.info.get("base_rss_mib")
        mem = f"{peak:.0f} | {peak - base:.0f}" if peak is not None and base is not None else "- | -"
        rows.append(
            f"| {n} | {med[n]:.2f} | {best:.2f} | {vs_naive} | {vs_pit} | {faults} | {mem} | {len(w.chunk_s)} |"
        )
    return rows


def ratio_interval(workers: dict[str, Worker], base: str, cand: str) -> Interval | None:
    """``cand``'s speed-up over ``base`` with its 95% interval: each round's chunk pair is one paired
    sample (``pitstop.measure.speedup_interval``: geometric mean of the per-round ratios, Student t)."""
    b, c = workers.get(base), workers.get(cand)
    if b is None or c is None:
        return None
    n = min(len(b.chunk_s), len(c.chunk_s))
    iv = speedup_interval([[t] for t in b.chunk_s[:n]], [[t] for t in c.chunk_s[:n]])
    return dataclasses.replace(iv, unit="chunks") if iv is not None else None


def verdict(iv: Interval, goal: float) -> str:
    """met: the whole interval at or above the goal; not met: wholly below; else undecided."""
    if iv.lo >= goal:
        return "met"
    return "not met" if iv.hi < goal else "undecided (the interval holds the goal)"


def goal_lines(workers: dict[str, Worker], bf16_hardware: bool) -> list[str]:
    """The issue's goals, checked against the chunks just measured: vs naive >= 2.0x on a CPU with bf16
    hardware, >= 1.5x without; vs each peer >= 1.0x. The ratio of medians is the table's; the verdict
    follows the per-round interval."""
    med = {n: 1.0 / statistics.median(w.chunk_s) for n, w in workers.items() if w.chunk_s}
    if "pitstop" not in med:
        return []
    goal = 2.0 if bf16_hardware else 1.5
    pairs = [
        ("naive", n, goal) for n in ("pitstop", "pitstop+compile", "pitstop-long") if "naive" in med and n in med
    ]
    pairs += [(peer, "pitstop", 1.0) for peer in ("lightning", "accelerate") if peer in med]
    out = []
    for base, cand, g in pairs:
        iv = ratio_interval(workers, base, cand)
        if iv is None:
            continue
        out.append(
            f"- {cand} vs {base}: {med[cand] / med[base]:.3f}x (ratio of medians); per-round {iv.text()}; "
            f"goal >= {g}x: {verdict(iv, g)}"
        )
    if "naive" in med and "naive+glibc" in med:
        r = med["naive+glibc"] / med["naive"]
        out.append(f"- the unmodified naive loop under `pitstop launch --allocator glibc`: {r:.3f}x of naive")
    return out


def warmup_lines(workers: dict[str, Worker]) -> list[str]:
    """The warm-up chunk of each pitstop row beside its median chunk: what compilation costs up front."""
    out = []
    for name in ("pitstop", "pitstop+compile", "pitstop-long"):
        w = workers.get(name)
        if w is not None and w.chunk_s:
            step_s = statistics.median(w.chunk_s)  # seconds a step, per chunk
            steps = w.warmup_s / step_s if step_s else 0.0
            out.append(
                f"- {name}: warm-up chunks {w.warmup_s:.2f} s (compilation and compile trial included where "
                f"on), {steps:.0f} steps' worth at its median step"
            )
    for name in ("pitstop", "pitstop-long"):
        if (w := workers.get(name)) is not None and w.info.get("compile") is not None:
            out.append(f"- {name} (TrainConfig default compile='auto'): {w.info['compile']}")
    plain, comp = workers.get("pitstop"), workers.get("pitstop+compile")
    if plain and comp and plain.chunk_s and comp.chunk_s:
        saved = statistics.median(plain.chunk_s) - statistics.median(comp.chunk_s)  # seconds a step
        extra = comp.warmup_s - plain.warmup_s
        out.append(
            f"- compile pays for its warm-up after {extra / saved:,.0f} steps ({extra:.1f} s more warm-up, "
            f"{1000 * saved:.2f} ms less a step)"
            if saved > 0
            else "- compile saves nothing a step here: its warm-up never pays"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--chunks", type=int, default=30, help="chunks per contender (the first is warm-up)")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per chunk")
    ap.add_argument(
        "--warmup-chunks", type=int, default=1, help="first chunks of every contender not counted (default 1)"
    )
    ap.add_argument(
        "--long-steps",
        type=int,
        default=200_000,
        help="the run length pitstop-long's fit is told (it is stopped after the chunks)",
    )
    ap.add_argument("--width", type=int, default=16, help="channels of the first conv (then 2x, 4x)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per worker (0 = torch default)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=32, help="image side (3 x size x size inputs)")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    ap.add_argument(
        "--out",
        type=Path,
        help=f"results file (default: {RESULTS}; without bf16: {RESULTS_NO_BF16}; emulated: {RESULTS_EMULATED})",
    )
    ap.add_argument(
        "--emulate-isa",
        choices=sorted(EMULATE),
        help="run as a CPU without bf16 hardware: re-run under oneDNN's ISA cap and ATen's kernel level",
    )
    ap.add_argument(
        "--peer-precision",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="Lightning's and Accelerate's precision; auto: bf16 (their documented speed setting) where "
        "pitstop's auto precision picks bf16 here, else fp32 (bf16 would be emulated)",
    )
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a)
        return
    if a.chunks <= a.warmup_chunks:
        raise SystemExit("--chunks must be more than --warmup-chunks")
    if a.emulate_isa and any(os.environ.get(k) != v for k, v in EMULATE[a.emulate_isa].items()):
        # torch reads both once, when it loads: re-run this process (and so its workers) under them
        os.execve(
            sys.executable,
            [sys.executable, __file__, *sys.argv[1:]],
            {**os.environ, **EMULATE[a.emulate_isa]},
        )
    import torch

    from pitstop.host.cpu import cpu_flags
    from pitstop.host.load import OtherCpu, load_average, load_line
    from pitstop.host.machine import machine_line
    from pitstop.matmul import cpu_bf16_check, cpu_bf16_line
    from pitstop.train.amp import resolve_precision

    load = load_average()
    bf16 = cpu_bf16_line(check=cpu_bf16_check())
    auto = resolve_precision("auto", "cpu")  # bf16 where the flags say so and bf16 torch.mm measured fast
    if a.peer_precision == "auto":
        a.peer_precision = "bf16" if auto is not None else "fp32"
    if a.out is None and a.emulate_isa:
        a.out = RESULTS_EMULATED.with_name(RESULTS_EMULATED.name.format(isa=a.emulate_isa))
    a.out = a.out or (RESULTS if auto is not None else RESULTS_NO_BF16)
    flags = cpu_flags()
    isa = ", ".join(f for f in ISA_FLAGS if f in flags) or "none of " + ", ".join(ISA_FLAGS)
    emulated = (
        f"; emulating a CPU without bf16 hardware (`--emulate-isa {a.emulate_isa}`: "
        + " ".join(f"{k}={v}" for k, v in EMULATE[a.emulate_isa].items())
        + ")"
        if a.emulate_isa
        else ""
    )
    other = OtherCpu()
    workers = run(a)
    other_share = other.share()
    threads = {w.info.get("threads") for w in workers.values()}
    table = fmt_table(workers, a)
    cmd = "flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/train_vs_peers.py " + " ".join(
        sys.argv[1:]
    )
    text = "\n".join(
        [
            "# train: pitstop.train vs a naive loop, Lightning and Accelerate (CPU conv net)",
            "",
            f"- machine: {machine_line()}{emulated}",
            f"- CPU ISA flags: {isa}; torch's ATen kernels: {torch.backends.cpu.get_cpu_capability()}",
            f"- date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}",
            f"- command: `{cmd.strip()}`",
            f"- workload: 5-conv BatchNorm net ({a.width}-{2 * a.width}-{2 * a.width}-{4 * a.width}-"
            f"{4 * a.width} channels) + linear, batch {a.batch} of "
            f"3x{a.size}x{a.size} random images, 10 classes, AdamW lr 1e-3; {a.steps} optimizer steps per "
            f"chunk, {a.chunks} chunks per contender (first {a.warmup_chunks} = warm-up, not counted), round-robin with "
            f"rotating order; torch threads per worker: {', '.join(str(t) for t in sorted(threads, key=str))}",
            f"- pitstop `auto` precision on this machine: {str(auto).removeprefix('torch.') if auto else 'fp32'} ({bf16}); Lightning and Accelerate "
            f"run {a.peer_precision} (`--peer-precision`)",
            "- each contender in its own process; RSS growth = peak RSS minus RSS after imports and setup",
            f"- {load_line(load)}; other processes used {other_share:.0%} of the machine's CPU time during the "
            "run (pitstop.host.load.OtherCpu); the interleaving spreads background load over all rows, but treat "
            "differences under ~10% as noise",
            "",
            *table,
            "",
            *goal_lines(workers, auto is not None),
            *warmup_lines(workers),
            "- where the step goes and each lever tried, with what it measured: "
            "benchmarks/results/train_levers.md",
            "",
        ]
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(text)
    print(f"written: {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
