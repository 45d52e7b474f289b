"""What `pitstop profile`'s per-step instruments cost, counted in instructions (valgrind's callgrind).

Step times on a shared 2-core machine swing by more than the instruments cost, and in a 2-rank job
the swing depends on how each launch happens to be scheduled. An instruction count does not: the same
steps give the same count, so it says exactly how much work the instruments add to a step, and which
part adds it. It is not a time (cache misses and the scheduler are what make the difference between the
two), so it complements the timed benchmarks (`profile_ranks_overhead.py`, `profile_ranks_insitu.py`)
and replaces none of them.

One process, a 1-rank gloo group and a DDP model (so that the rank's instruments have a reducer to
read), three configurations, each in its own process under callgrind (`item_sync`: examples/item_sync.py's
MLP and per-sample syncs, no DDP; `slow_loader`: examples/slow_loader.py's main-process JPEG loader and
small CNN, no DDP, 8 steps after 12):

- plain: no pitstop;
- instruments: `Instrumentation` installed as `pitstop profile` installs it in the script's process;
- instruments + rank: with the rank worker too (`RankWorker.on_install`), as under `pitstop profile --
  torchrun`.

Each process steps past pitstop's warm-up, then counts the user-space instructions of its steps
(callgrind's client requests, from a 3-line C helper compiled here), after a `gc.collect()`, so that
every count starts from the same GC state and repeats. The periodic flush and the rank's
state file are written per second of wall time; under callgrind a second is a few steps, so they are
switched off for the count (their cost is in the timed benchmarks). Two models: a tiny one (the
instruments' share is large) and the rank benchmarks' workload.

    .venv/bin/python benchmarks/profile_step_instructions.py

Needs valgrind, a C compiler and valgrind's headers (Debian: `apt-get install valgrind gcc`); says so
and stops where one is missing. Writes `benchmarks/results/profile_step_instructions.md`.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "profile_step_instructions.md"
STEPS = {"tiny": 96, "workload": 24, "item_sync": 24, "slow_loader": 8}  # multiples of the reducer-timer sample (8)
WARM = 40
# slow_loader's steps decode and augment 16 JPEGs each (~60 ms natively): fewer steps, past pitstop's
# warm-up (5) and the global forward hooks' narrowing (2 more)
WARM_STEPS = {"slow_loader": 12}
CONFIGS = ("plain", "instruments", "rank")
MODELS = {"tiny": (16, 16, 8, 64), "workload": (256, 512, 8, 64), "item_sync": (128, 512, 3, 128),
          "slow_loader": (3, 32, 4, 16)}  # in, hidden, out, batch
# examples/item_sync.py's step: a model without DDP (no rank instruments to add) and a host sync per sample;
# examples/slow_loader.py's: its JPEG ImageFolder (64 images) decoded and augmented in the main process
NO_DDP = {"item_sync", "slow_loader"}
WHAT = {"item_sync": "a sync per sample", "slow_loader": "16 JPEGs decoded and augmented a step"}
HELPER = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS; }
"""


def worker(config: str, model_name: str, helper: str) -> None:
    import ctypes

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="pitstop-instr-"))
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    if config != "plain":
        import pitstop.profile.capture.hooks as hooks
        import pitstop.profile.rank.rank_worker as rank_worker
        from pitstop.profile.capture.hooks import Config, Instrumentation

        # the flush and the rank's state file are written per second of wall time: a few steps under callgrind
        hooks.FLUSH_EVERY_S = rank_worker.WATCH_S = float("inf")
        inst = Instrumentation(Config(steps=10, warmup=5, full=True, out_dir=tmp, probes=False))
        inst.flush_path = tmp / "measurements.json"
        inst.install()
        if config == "rank":
            from pitstop.profile.rank.rank_worker import Identity, RankWorker

            RankWorker(Identity(rank=0, world=1, local_rank=0, local_world=1, node=0), tmp).on_install(inst)
    step = slow_loader_step() if model_name == "slow_loader" else mlp_step(model_name)
    for _ in range(WARM_STEPS.get(model_name, WARM)):  # past the warm-up (the DDP forward wrapper in place)
        step()
    cg = ctypes.CDLL(helper)
    # every window starts from empty GC generations, so whether a collection falls inside it depends on
    # what the steps allocate, not on where the warm-up left the counters
    gc.collect()
    cg.cg_start()
    for _ in range(STEPS[model_name]):
        step()
    cg.cg_stop()
    os._exit(0)  # the instruments stay installed: leave without running torch's exit path


def mlp_step(model_name: str) -> Callable[[], None]:
    """One training step of an MLP (DDP unless in ``NO_DDP``; item_sync's per-sample syncs)."""
    import torch
    from torch import nn

    n_in, hidden, n_out, batch = MODELS[model_name]
    layers = [nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_out)]
    model = nn.Sequential(*layers)
    if model_name not in NO_DDP:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, n_in), torch.randint(0, n_out, (batch,))
    per_sample = model_name in NO_DDP
    correct: list[bool] = []

    def step() -> None:
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if per_sample:
            preds = logits.detach().argmax(1)
            for i in range(len(y)):
                correct.append(bool(preds[i] == y[i]))

    return step


def slow_loader_step() -> Callable[[], None]:
    """One step of examples/slow_loader.py: the next batch from its main-process DataLoader (a new
    iterator each epoch of 4 batches), forward, backward, SGD; seeded, so both configs see the same crops."""
    import importlib.util

    import torch
    from torch import nn
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    spec = importlib.util.spec_from_file_location("slow_loader", ROOT / "examples" / "slow_loader.py")
    assert spec is not None and spec.loader is not None
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    torch.manual_seed(0)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(128, scale=(0.5, 1.0)), transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.4, 0.4, 0.4, 0.1), transforms.GaussianBlur(7, sigma=(0.1, 2.0)),
        transforms.RandomRotation(10), transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])  # fmt: skip
    data = datasets.ImageFolder(str(ex.image_folder(64)), transform=tf)
    loader = DataLoader(data, batch_size=MODELS["slow_loader"][3], shuffle=True, num_workers=0, drop_last=True)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, len(data.classes)),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)
    loss_fn = nn.CrossEntropyLoss()
    batches = iter(())

    def step() -> None:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def missing() -> str | None:
    if not shutil.which("valgrind"):
        return "valgrind is not installed (Debian: apt-get install valgrind)"
    if not (shutil.which("cc") or shutil.which("gcc")):
        return "no C compiler for the 3-line callgrind helper (Debian: apt-get install gcc)"
    if not Path("/usr/include/valgrind/callgrind.h").exists():
        return "valgrind's headers are missing (/usr/include/valgrind/callgrind.h)"
    return None


def build_helper(folder: Path) -> Path:
    src, lib = folder / "cgctl.c", folder / "libcgctl.so"
    src.write_text(HELPER)
    cc = shutil.which("cc") or shutil.which("gcc") or "cc"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    return lib


def count(config: str, model_name: str, helper: Path, folder: Path, timeout_s: float = 1800) -> int:
    out = folder / f"cg-{model_name}-{config}.out"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable,
         __file__, "--worker", config, model_name, str(helper)],
        env=env, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    m = re.search(r"Collected : (\d+)", p.stderr)
    if p.returncode != 0 or m is None or int(m.group(1)) == 0:  # a worker that failed before it counted
        raise RuntimeError(f"{model_name}/{config}: no count from callgrind: {p.stderr[-2000:]}")
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=3, metavar=("CONFIG", "MODEL", "HELPER"))
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), help="models to count (default: all)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results file")
    ap.add_argument("--timeout-s", type=float, default=1800, help="per process (a busy machine: more)")
    a = ap.parse_args()
    if a.worker:
        worker(*a.worker)
        return 0
    why = missing()
    if why:
        print(f"profile_step_instructions: cannot count: {why}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from profile_ranks_overhead import machine

    start = dt.datetime.now(dt.UTC)
    folder = Path(tempfile.mkdtemp(prefix="pitstop-instr-"))
    helper = build_helper(folder)
    models = a.only or list(MODELS)
    jobs = [(c, m) for m in models for c in CONFIGS if not (c == "rank" and m in NO_DDP)]
    with cf.ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        got = dict(zip(jobs, pool.map(lambda j: count(*j, helper, folder, a.timeout_s), jobs), strict=True))
    rows = []
    for m in models:
        if m in NO_DDP:
            plain, inst = (got[(c, m)] / STEPS[m] for c in CONFIGS[:2])
            rows.append(
                f"| {m} ({'x'.join(map(str, MODELS[m][:3]))}, batch {MODELS[m][3]}, no DDP, {WHAT[m]}; "
                f"{STEPS[m]} steps) | {plain / 1e3:,.0f}k | +{(inst - plain) / 1e3:,.1f}k "
                f"({100 * (inst - plain) / plain:+.1f}%) | (no rank) | |"
            )
            continue
        plain, inst, rank = (got[(c, m)] / STEPS[m] for c in CONFIGS)
        rows.append(
            f"| {m} ({'x'.join(map(str, MODELS[m][:3]))}, batch {MODELS[m][3]}; {STEPS[m]} steps) | {plain / 1e3:,.0f}k | "
            f"+{(inst - plain) / 1e3:,.1f}k ({100 * (inst - plain) / plain:+.1f}%) | "
            f"+{(rank - inst) / 1e3:,.1f}k | +{(rank - plain) / 1e3:,.1f}k ({100 * (rank - plain) / plain:+.1f}%) |"
        )
    text = "\n".join([
        "# profile: instructions a step, plain and with pitstop's per-step instruments (callgrind)",
        "",
        f"- date: {start:%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine()}",
        f"- command: `{' '.join(['.venv/bin/python benchmarks/profile_step_instructions.py', *sys.argv[1:]])}`",
        "- method: one process each under `valgrind --tool=callgrind`, a 1-rank gloo DDP model (item_sync: the "
        "same MLP without DDP, with examples/item_sync.py's per-sample `bool(preds[i] == y[i])`; slow_loader: examples/slow_loader.py's "
        "loader, augmentations and CNN, seeded), user-space "
        f"instructions of all threads over the steps after {WARM} (slow_loader: 12; past pitstop's warm-up), "
        "divided by the steps, each count starting after a `gc.collect()`; "
        "the periodic flush and the rank's state-file thread off (they run per second of wall time, which "
        "is a few steps under callgrind; about 0.35 ms of CPU a second for the flush). Counts, not times: "
        "the same on a quiet or a busy machine",
        "",
        "| model | plain, per step | instruments | the rank's, on top | both (as under torchrun) |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
    ])  # fmt: skip
    a.out.write_text(text)
    print(f"{text}\nwritten to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
