"""What ``torch.compile`` saves a step and costs to compile on this CPU: the figures behind compile='auto'.

``TrainConfig(compile='auto')`` on a CPU starts a measured trial (compile, then eager and compiled blocks
interleaved; kept only where it helped) when steps left x eager step x ``TRIAL_MIN_SAVING`` >
``COMPILE_S[device]``; on CUDA it compiles when steps left x eager step x ``SAVING['cuda']`` > ``COMPILE_S``
(``pitstop.recipes.compile``). This measures saving and compilation on the models pitstop.train
runs here, set up as ``fit`` sets them up (its ``auto`` precision, channels_last with its NHWC-gradient
hooks for a conv net, fused AdamW, the model wrapped by the compile component's ``wrap``):

  conv         the 5-conv BatchNorm net of benchmarks/train_vs_peers.py (batch 64 of 3x32x32)
  transformer  a small encoder: 2 layers, d_model 128, 4 heads, sequence 64, batch 32, 1000 tokens

Each workload runs in two fresh processes sharing one new inductor cache directory: the first compiles
cold (empty cache) and then times the step, the second compiles with that cache warm. Compilation =
the wall time of the first compiled step less a median eager step. The step saving comes from eager and
compiled copies of the model interleaved in rotating rounds (``pitstop.measure.interleave``), each step
timed by ``pitstop.measure.time_block`` on the thread's CPU time with 1 torch thread (robust to other
processes' load: every kernel runs in the calling thread), the speed-up's 95% interval by
``pitstop.measure.speedup_interval``. Compile time is wall time (inductor compiles in worker
processes), so it grows with the machine's load, which is stated.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/compile_auto.py [--emulate-isa avx2]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
TAG = "@@compile-auto "
EMULATE = {"avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}}


def _workload(name: str) -> tuple[Any, Any, Any]:
    """(model, batches, loss function) of the workload, seeded."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    if name == "conv":
        from train_vs_peers import build

        model, loader = build(0, 64 * 8, 64, 32, 16)
        return model, list(loader), F.cross_entropy
    vocab, seq, d = 1000, 64, 128

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(d, vocab)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.enc(self.emb(x))).flatten(0, 1)

    batches = [(torch.randint(0, vocab, (32, seq)), torch.randint(0, vocab, (32 * seq,))) for _ in range(8)]
    return Encoder(), batches, F.cross_entropy


def child(a: argparse.Namespace) -> None:
    """One process: eager and compiled copies, the compiled one's first step timed, then (cold run
    only) interleaved rounds of both."""
    import torch

    from pitstop import measure
    from pitstop.measure.clock import Stopwatch, time_block
    from pitstop.recipes import channels_last
    from pitstop.recipes import compile as torch_compile
    from pitstop.train.amp import resolve_precision

    torch.set_num_threads(1)
    model, batches, loss_fn = _workload(a.workload)
    dtype = resolve_precision("auto", "cpu")
    conv = channels_last.has_conv2d(model)
    if conv:
        channels_last.apply_model(model)
        channels_last.train_model(model)
        batches = [channels_last.apply_input(b) for b in batches]
    arms: dict[str, tuple[Any, Any]] = {}
    for name in ("eager", "compiled"):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
        arms[name] = (torch_compile.wrap(m) if name == "compiled" else m, opt)
    it = {"i": 0}

    def step(name: str) -> None:
        m, opt = arms[name]
        x, y = batches[it["i"] % len(batches)]
        it["i"] += 1
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    eager = [time_block(lambda: step("eager"), 1) for _ in range(12)][4:]  # wall: the compile's baseline
    watch = Stopwatch()
    step("compiled")
    first = watch.elapsed()
    out: dict[str, Any] = {
        "dtype": str(dtype).removeprefix("torch.") if dtype else "float32",
        "eager_wall_s": statistics.median(eager),
        "first_compiled_s": first,
        "compile_s": first - statistics.median(eager),
        "failed": repr(torch_compile.failed(arms["compiled"][0])),
        "capability": torch.backends.cpu.get_cpu_capability(),
    }
    if a.rounds:
        for _ in range(3):
            step("compiled")  # recompiles, if any, before the rounds
        base, cand = measure.Arm("eager"), measure.Arm("compiled")

        def sample(name: str) -> list[float]:
            return [time_block(lambda: step(name), 1, clock=time.thread_time) for _ in range(a.steps)]

        measure.interleave(base, [cand], sample, measure.Settings.every_round(a.rounds))
        iv = measure.speedup_interval(base.rounds, cand.rounds)
        eager_s = statistics.median(s for r in base.rounds for s in r)
        comp_s = statistics.median(s for r in cand.rounds for s in r)
        assert iv is not None
        out.update(
            eager_cpu_s=eager_s,
            compiled_cpu_s=comp_s,
            speedup=iv.estimate,
            lo=iv.lo,
            hi=iv.hi,
            rounds=iv.rounds,
            saving=1 - 1 / iv.estimate,
        )
    print(TAG + json.dumps(out), flush=True)


def run_child(a: argparse.Namespace, workload: str, cache: str, rounds: int) -> dict[str, Any]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONWARNINGS": "ignore"}
    if a.emulate_isa:
        env.update(EMULATE[a.emulate_isa])
    cmd = [sys.executable, __file__, "--child", "--workload", workload, "--rounds", str(rounds)]
    cmd += ["--steps", str(a.steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG) :])
    raise RuntimeError(f"{workload} child failed: {proc.stderr[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", nargs="+", default=["conv", "transformer"], choices=("conv", "transformer"))
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds of eager vs compiled")
    ap.add_argument("--steps", type=int, default=6, help="steps an arm a round")
    ap.add_argument("--emulate-isa", choices=sorted(EMULATE), help="as train_vs_peers.py: a CPU without bf16")
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds a child process may take")
    a = ap.parse_args()
    if a.child:
        a.workload = a.workload[0]
        child(a)
        return
    from pitstop.host.load import load_average, load_line
    from pitstop.host.machine import machine_line

    print(f"machine: {machine_line()}; emulate: {a.emulate_isa or 'no'}")
    for workload in a.workload:
        with tempfile.TemporaryDirectory(prefix="pitstop-inductor-") as cache:
            load = load_average()
            cold = run_child(a, workload, cache, a.rounds)
            warm = run_child(a, workload, cache, 0)
            print(
                f"{workload}: {cold['dtype']}, ATen {cold['capability']}; eager step {1000 * cold['eager_cpu_s']:.1f} ms "
                f"CPU ({1000 * cold['eager_wall_s']:.1f} ms wall), compiled {1000 * cold['compiled_cpu_s']:.1f} ms: "
                f"{cold['speedup']:.3f}x (95% CI {cold['lo']:.3f}-{cold['hi']:.3f}, {cold['rounds']} rounds), "
                f"saving {cold['saving']:.1%}; compilation {cold['compile_s']:.1f} s cold, {warm['compile_s']:.1f} s "
                f"warm cache; fell back: {cold['failed']}; {load_line(load)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
