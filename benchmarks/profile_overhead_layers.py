"""Where an example's end-to-end profiling overhead comes from: concurrent pairs of plain vs pitstop's
layers added one at a time.

``profile_overhead.py`` compares the plain script with the whole of ``pitstop profile``. This script
runs the same concurrent pairs (``profile_overhead_pairs``: side by side, each pinned to a core, cores
swapped every round, each layer started first by its own median start-up lag) for the layers between
them, each in a fresh process started as ``python -c CODE script args``:

  aa         the plain script again (the A/A floor of the pairs)
  imports    pitstop's capture modules imported, the script run by runpy
  watchdog   + an ``Instrumentation`` made and its watchdog thread started, nothing installed
  install    + ``Instrumentation.install()`` (every patch and hook, the periodic flush to a file): the
             script's process as under ``pitstop profile``, less the bootstrap and the parent
  reverted   ``install()`` then ``uninstall()`` before the script starts: what installing leaves
             behind once undone (heap and type state), with no instrument left on
  profiled   ``pitstop profile --full --no-probes`` (the parent on the same core)

and, to split ``install()`` (each on top of ``watchdog``, one part alone):

  loader     the DataLoader patches          syncs      the host-sync wrappers
  models     the global module hooks         torch      the ``torch`` call patches, all of them
  to         ``Tensor.to`` / ``Tensor.cuda`` only
  backward   ``Tensor.backward``, ``torch.autograd.backward`` / ``grad`` only
  optinit    ``Optimizer.__init__`` only     opthooks   the optimizer step pre/post hooks only

The first round of each layer calibrates its lead and is not counted. Overhead = layer / plain, the
geometric mean of the rounds' paired ratios with its 95% Student t interval
(``pitstop.measure.speedup_interval``).

    flock -x /tmp/pitstop-bench.lock .venv/bin/python benchmarks/profile_overhead_layers.py \
        [--example slow_loader.py] [--rounds 10] [--layers aa imports watchdog install profiled]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import profile_overhead_pairs as pairs  # noqa: E402

from pitstop.measure import speedup_interval  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "profile_overhead_layers.md"
ARGS = {"slow_loader.py": ["--steps", "120", "--images", "64"], "item_sync.py": ["--steps", "1400"]}
RUN = "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
IMPORTS = "import runpy, sys\nfrom pathlib import Path\nimport pitstop.profile.capture.hooks, pitstop.profile.capture.watchdog\n"
MADE = (
    "from pitstop.profile.capture.hooks import Config, Instrumentation\n"
    "from pitstop.profile.capture.watchdog import Watchdog\n"
    "inst = Instrumentation(Config(full=True, out_dir=Path({out!r}), probes=False))\n"
    "inst.flush_path = Path({out!r}) / 'measurements.json'\n"
    "Watchdog(inst).start()\n"
)
LAYERS = ("aa", "imports", "watchdog", "install", "reverted", "profiled")
# one part of ``Instrumentation.install()`` each (``inst`` made as in ``watchdog``); the torch-call
# patches also one by one, through ``torchcalls.PARTS``
TORCH_PART = "from pitstop.profile.capture.torchcalls import PARTS\nPARTS[{name!r}](inst, inst.patches)\n"
PARTS = {
    "loader": "from pitstop.profile.capture.loaders import install_loader_patches\n"
    "install_loader_patches(inst, inst.patches, inst.loaders)\n",
    "syncs": "inst.sync_wrappers.install(inst.patches)\n",
    "models": "inst.models.install(inst.patches)\n",
    "torch": "from pitstop.profile.capture.torchcalls import install_torch_patches\n"
    "install_torch_patches(inst, inst.patches)\n",
    **{name: TORCH_PART.format(name=name) for name in ("to", "backward", "optinit", "opthooks")},
}


def commands(script: Path, args: list[str], out: str) -> dict[str, list[str]]:
    """Each layer's command line; ``plain`` the script alone."""
    plain = [sys.executable, str(script), *args]
    made = IMPORTS + MADE.format(out=out)
    code = {
        "imports": IMPORTS + RUN,
        "watchdog": made + RUN,
        "install": made + "inst.install()\n" + RUN,
        "reverted": made + "inst.install()\ninst.uninstall()\n" + RUN,
        **{k: made + part + RUN for k, part in PARTS.items()},
    }
    cmds = {k: [sys.executable, "-c", c, str(script), *args] for k, c in code.items()}
    cmds["profiled"] = pairs.commands(script, args, out + "/profiled")["profiled"]
    return {"plain": plain, "aa": plain, **cmds}


def run(example: str, rounds: int, layers: list[str]) -> dict[str, list[tuple[float, float]]]:
    """(plain ms, layer ms) of each counted round, per layer (``profile_overhead_pairs.rotated``)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    seen: dict[str, list[tuple[float, float]]] = {k: [] for k in layers}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = commands(ROOT / "examples" / example, ARGS.get(example, []), tmp)
        pairs.rotated(
            {k: cmd[k] for k in layers},
            cmd["plain"],
            env,
            lambda kind, plain_ms, layer_ms: seen[kind].append((plain_ms, layer_ms)),
            lambda _n: False,
            rounds,
            f"{example} ",
        )
    return seen


def table(seen: dict[str, list[tuple[float, float]]]) -> list[str]:
    rows = [
        "| layer | rounds | overhead (95% CI) | plain / layer median ms/step |",
        "| --- | --- | --- | --- |",
    ]
    for k, pts in seen.items():
        iv = speedup_interval([[o] for _, o in pts], [[p] for p, _ in pts])  # layer ms / plain ms
        if iv is None:
            continue
        plain_ms = sorted(p for p, _ in pts)[len(pts) // 2]
        layer_ms = sorted(o for _, o in pts)[len(pts) // 2]
        rows.append(
            f"| {k} | {len(pts)} | {100 * (iv.estimate - 1):+.1f}% ({100 * (iv.lo - 1):+.1f}% to "
            f"{100 * (iv.hi - 1):+.1f}%) | {plain_ms:.2f} / {layer_ms:.2f} |"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default="slow_loader.py")
    ap.add_argument("--rounds", type=int, default=10, help="counted rounds per layer (one more calibrates)")
    ap.add_argument("--layers", nargs="+", default=list(LAYERS), choices=[*LAYERS, *PARTS])
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    if pairs.usable_pair() is None:
        raise SystemExit("concurrent pairs need two usable cores; this process has fewer")
    from pitstop.host.load import OtherCpu, load_average, load_line
    from pitstop.host.machine import machine_line

    load0, other = load_average(), OtherCpu()
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    seen = run(a.example, a.rounds, a.layers)
    lines = [
        f"# profile: {a.example}'s end-to-end overhead, layer by layer (concurrent pairs)",
        "",
        f"- machine: {machine_line()}; OMP_NUM_THREADS=1 in every run",
        f"- date: {started}",
        f"- load: {load_line(load0)}; other processes used {other.share():.0%} of the CPUs during the runs",
        f"- command: `{' '.join(['benchmarks/profile_overhead_layers.py', *sys.argv[1:]])}`",
        f"- example arguments: {' '.join(ARGS.get(a.example, [])) or '(its defaults)'}",
        "- method: the module docstring; overhead = layer / plain ms/step, geometric mean over rounds, 95% t",
        "",
        *table(seen),
        "",
        "Per round (plain/layer ms/step): "
        + "; ".join(f"{k} " + " ".join(f"{p:.1f}/{o:.1f}" for p, o in pts) for k, pts in seen.items()),
    ]
    a.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
