"""The runner end to end: real child processes running small scripts, and what comes back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from pitstop.findings import Severity
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.runs.runner import CommandError, RunSpec, parse_command, run

pytestmark = pytest.mark.slow

TRAIN = """
import sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
ds = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
loader = DataLoader(ds, batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
{before}
for epoch in range({epochs}):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        {step}
        {after}
"""


def script(
    tmp_path: Path,
    name: str = "train.py",
    before: str = "",
    after: str = "",
    step: str = "opt.step()",
    epochs: int = 1,
    text: str | None = None,
) -> Path:
    p = tmp_path / name
    p.write_text(
        text if text is not None else TRAIN.format(before=before, after=after, step=step, epochs=epochs)
    )
    return p


def spec(path: Path, *args: str, **kw) -> RunSpec:
    kw.setdefault("steps", 4)
    kw.setdefault("warmup", 1)
    kw.setdefault("quiet", True)
    kw.setdefault("probes", False)
    return RunSpec(command=[sys.executable, str(path), *args], **kw)


def test_parse_command_forms(tmp_path):
    p = script(tmp_path)
    assert parse_command(["python", str(p), "--lr", "1"]) == ("script", str(p.resolve()), ["--lr", "1"])
    assert parse_command(["python3.11", "-u", "-m", "pkg.mod", "a"]) == ("module", "pkg.mod", ["a"])
    assert parse_command([str(p)])[0] == "script"
    assert parse_command(["train.py", "x"], cwd=str(tmp_path)) == ("script", str(p.resolve()), ["x"])
    for bad in ([], ["python"], ["python", "-c", "print(1)"], ["python", "nope.py"], ["python", "-m"]):
        with pytest.raises(CommandError):
            parse_command(bad, cwd=str(tmp_path))


def test_measures_steps_losses_and_stops_cleanly(tmp_path):
    out = tmp_path / "out"
    r = run(spec(script(tmp_path, epochs=50), steps=5, warmup=2), out_dir=out)
    assert r.status == "stopped" and r.ok and r.returncode == 0 and r.error is None
    assert len(r.steps) == 5 and len(r.warmup_steps) == 2
    assert len(r.losses) == 5 and all(0.0 < v < 5.0 for v in r.losses)
    assert all(s.total_s > 0 and s.forward_s > 0 for s in r.steps)
    assert r.steps_per_s() > 0
    assert r.config["loaders"][0]["batch_size"] == 8
    assert r.config["loaders"][0]["location"].endswith("train.py:8")
    assert r.config["optimizers"][0]["type"] == "SGD"
    assert (out / "measurements.json").is_file()
    assert 0.0 <= r.data["other_cpu_share"] <= 1.0  # other processes' CPU use over the run


def test_argv_main_and_sys_path_as_if_run_directly(tmp_path):
    (tmp_path / "helper_mod_x.py").write_text("VALUE = 41\n")
    p = script(
        tmp_path,
        text=textwrap.dedent(
            """
            import json, os, sys
            import helper_mod_x  # importable because the script's folder is sys.path[0]
            json.dump({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "v": helper_mod_x.VALUE},
                      open(os.environ["OUT_JSON"], "w"))
            """
        ),
    )
    out = tmp_path / "seen.json"
    r = run(spec(p, "--flag", "x y", env={"OUT_JSON": str(out)}))
    import json

    seen = json.loads(out.read_text())
    assert seen == {
        "argv": [str(p.resolve()), "--flag", "x y"],
        "name": "__main__",
        "path0": str(tmp_path),
        "v": 41,
    }
    assert r.status == "completed" and "no optimizer step" in (r.error or "")
    assert r.report().by_id("profile.no_step") is not None


def test_module_form(tmp_path):
    pkg = tmp_path / "mypkg_prof"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    script(pkg, name="train.py", epochs=20)
    r = run(
        RunSpec(
            command=["python", "-m", "mypkg_prof.train"],
            steps=3,
            warmup=1,
            cwd=str(tmp_path),
            quiet=True,
            probes=False,
        )
    )
    assert r.status == "stopped", r.error
    assert len(r.steps) == 3


def test_script_raising_mid_run_keeps_the_measured_steps(tmp_path):
    p = script(tmp_path, before="n = 0", after="n += 1\n        if n == 4: raise ValueError('boom <b>')")
    r = run(spec(p, steps=50))
    assert r.status == "error" and r.returncode == 1
    assert "ValueError: boom <b>" in r.error and "train.py" in r.error
    assert len(r.warmup_steps) + len(r.steps) >= 3
    assert 0.0 <= r.data["other_cpu_share"] <= 1.0  # measured however the script ended
    rep = r.report()
    assert "Traceback" in rep.error


def test_syntax_error_and_missing_script(tmp_path):
    p = script(tmp_path, text="def broken(:\n    pass\n")
    r = run(spec(p))
    assert r.status == "error" and r.returncode == 1 and "SyntaxError" in r.error
    r = run(spec(tmp_path / "missing.py"))
    assert r.status == "not_started" and r.returncode == 2 and "not found" in r.error
    assert r.report().error


def test_system_exit_nonzero_is_a_failure(tmp_path):
    p = script(tmp_path, text="import sys\nsys.exit(3)\n")
    r = run(spec(p))
    assert r.status == "exited" and r.returncode == 3 and not r.ok


HANG = """
import os, signal, time
from pathlib import Path
import torch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
{setup}
for i in range(100):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    if i == 4:
        Path(os.environ["MARKER"]).write_text("hanging")
        time.sleep(3600)
"""


def test_hung_script_is_stopped_by_the_timeout(tmp_path):
    """The final record after SIGINT (with the steps) is covered by the Ctrl-C test; here: the watchdog."""
    r = run(spec(script(tmp_path, text="import time\ntime.sleep(3600)\n"), timeout=6))
    assert r.status == "timeout" and "timed out after 6 s" in r.error and not r.ok
    assert r.report().error


def test_script_ignoring_sigint_is_killed_and_partial_data_kept(tmp_path, monkeypatch):
    """Ctrl-C (simulated from the progress callback once the script hangs), SIGINT ignored, SIGKILL
    after the grace period: the periodic record is what comes back."""
    import pitstop.profile.runs.supervise as supervise

    monkeypatch.setattr(supervise, "GRACE_S", 1.0)
    marker = tmp_path / "m"
    text = HANG.format(setup="signal.signal(signal.SIGINT, signal.SIG_IGN)")
    env = {"MARKER": str(marker), "PITSTOP_PROFILE_FLUSH_S": "0"}

    def progress(done: int, total: int) -> None:
        if marker.exists():
            raise KeyboardInterrupt

    r = run(spec(script(tmp_path, text=text), steps=100, env=env), progress=progress)
    assert r.status == "interrupted" and r.returncode == -9
    assert len(r.warmup_steps) + len(r.steps) >= 4  # from the per-step flush before the hang


def test_a_run_started_with_sigint_ignored_is_still_stopped_by_sigint(tmp_path, monkeypatch):
    """pitstop started from a background job (SIGINT inherited as ignored): the script is still stopped by
    pitstop's SIGINT, sees KeyboardInterrupt and writes its final record; it is not killed."""
    import signal

    marker = tmp_path / "m"
    env = {"MARKER": str(marker), "PITSTOP_PROFILE_FLUSH_S": "0"}

    def progress(done: int, total: int) -> None:
        if marker.exists():
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child inherits it across exec
    try:
        r = run(spec(script(tmp_path, text=HANG.format(setup="")), steps=100, env=env), progress=progress)
    finally:
        signal.signal(signal.SIGINT, old)
    assert r.status == "interrupted" and r.returncode == 130  # its own exit after the record, not -9
    assert len(r.warmup_steps) + len(r.steps) == 5 and "interrupted" in (r.error or "")


def test_dataloader_worker_crash_is_reported(tmp_path):
    text = textwrap.dedent(
        """
        import os
        import torch
        from torch.utils.data import DataLoader, Dataset
        class Bad(Dataset):
            def __len__(self): return 64
            def __getitem__(self, i):
                if i == 40: os._exit(7)
                return torch.randn(4), 0
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(Bad(), batch_size=4, num_workers=1):
            model(x).sum().backward()
            opt.step()
        """
    )
    r = run(spec(script(tmp_path, text=text), steps=100))
    assert r.status == "error" and not r.ok, (r.status, r.error, r.data.get("finalize_error"))
    assert "DataLoader worker" in r.error
    assert len(r.warmup_steps) + len(r.steps) >= 5


def test_callback_at_step_and_loader(tmp_path):
    (tmp_path / "cb_prof_mod.py").write_text(
        "def at_step(cap):\n"
        "    return {'models': len(cap.models), 'optimizers': len(cap.optimizers), 'batch': list(cap.last_batch[0].shape)}\n"
        "def at_loader(cap):\n"
        "    return {'num_workers': cap.loaders[0].loader.num_workers, 'where': cap.loaders[0].location}\n"
        "def bad(cap):\n"
        "    return object()\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    p = script(tmp_path, epochs=50)
    r = run(spec(p, callback="cb_prof_mod:at_step", callback_at="step", warmup=2, env=env))
    assert r.status == "stopped" and r.callback_result == {"models": 1, "optimizers": 1, "batch": [8, 8]}
    assert len(r.warmup_steps) == 2 and r.steps == []
    r = run(
        spec(p, callback="cb_prof_mod:at_loader", env=env, overrides=Overrides(dataloader={"num_workers": 0}))
    )
    assert r.status == "stopped" and r.callback_result["num_workers"] == 0
    assert r.callback_result["where"].endswith("train.py:8")
    r = run(spec(p, callback="cb_prof_mod:bad", env=env))
    assert r.callback_result is None and "JSON" in r.error


def test_overrides_reach_the_child(tmp_path):
    p = script(tmp_path, epochs=50)
    ov = Overrides(
        dataloader={"batch_size": 16, "num_workers": 1, "persistent_workers": True}, optimizer_impl="foreach"
    )
    r = run(spec(p, overrides=ov))
    assert r.ok, r.error
    ld = r.config["loaders"][0]
    assert (ld["batch_size"], ld["num_workers"], ld["persistent_workers"]) == (16, 1, True)
    assert r.config["optimizers"][0]["impl"] == "foreach"


def test_trace_writes_a_chrome_trace_and_top_ops(tmp_path):
    out = tmp_path / "out"
    r = run(spec(script(tmp_path, epochs=50), steps=5, warmup=1, trace=True), out_dir=out)
    assert r.ok, r.error
    assert r.trace_path and Path(r.trace_path).is_file()
    top = r.data["trace"]["top_ops"]
    assert top and any("addmm" in row["name"] or "linear" in row["name"] for row in top)
    assert sum(s.traced for s in r.steps) >= 1
    # pitstop's own tracks, on torch.profiler's time base: its steps hold the profiler's step markers
    import json

    from pitstop.profile.capture.trace import PID

    events = json.loads(Path(r.trace_path).read_text())["traceEvents"]
    ours = [e for e in events if e.get("pid") == PID and e.get("ph") == "X"]
    names = {e["name"] for e in ours}
    assert {"forward", "backward", "optimizer"} <= names
    steps = [e for e in ours if e["tid"] == 1]
    marks = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    assert steps and marks
    lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    # the profiler's recorded steps lie inside pitstop's (clocks aligned to within a millisecond)
    assert all(lo - 1000 <= m["ts"] and m["ts"] + m["dur"] <= hi + 1000 for m in marks)
    phases = [e for e in ours if e["tid"] == 2]
    assert all(lo - 1000 <= e["ts"] <= hi + 1000 for e in phases)


def test_probes_measure_a_conv_net(tmp_path):
    """The probes time the script's own model; on any CPU, channels_last on a conv net gets measured."""
    text = textwrap.dedent(
        """
        import torch
        from torch import nn
        torch.set_num_threads(1)
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(100):
            model(torch.randn(4, 3, 16, 16)).sum().backward()
            opt.step()
        """
    )
    r = run(spec(script(tmp_path, text=text), probes=True))
    probes = r.data["probes"]
    assert {"base_s", "new_s", "saving_s"} <= set(probes["channels_last"])
    assert probes["optimizer"][0]["type"] == "SGD" and "saving_s" in probes["optimizer"][0]
    f = r.report().by_id("memory_format.channels_last")
    # measured: faster, ruled out (a pass), or undecided where the interval straddles the bar (a busy machine)
    assert f is not None and (
        f.severity is Severity.PASS or (f.est_saving_s or 0) > 0 or f.data.get("verdict") == "undecided"
    ), f


def test_other_processes_cpu_use_is_measured(tmp_path):
    """A process outside pitstop's tree burning a core during the run is counted as other processes'
    load; the script's own CPU is not, even a busy process it leaves running when it ends."""
    pid_file = tmp_path / "burner.pid"
    # detached (its parent shell exits at once, having written its pid): not in the script's session
    burn = f'"{sys.executable}" -c "while True: pass" >/dev/null 2>&1 & echo $! > "{pid_file}"'
    subprocess.run(["sh", "-c", burn], check=True)
    try:
        r = run(spec(script(tmp_path, epochs=400), steps=40, warmup=2))
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert r.status == "stopped"
    # the burner had one of the machine's CPUs, less what the script took from it
    assert r.data["other_cpu_share"] > 0.4 / psutil.cpu_count(), r.data["other_cpu_share"]

    # the script's own busy child, still running when the script ends (orphaned, never waited for)
    child = "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'while True: pass'])"
    r = run(spec(script(tmp_path, name="own.py", before=child, epochs=400), steps=40, warmup=2))
    assert r.status == "stopped"
    assert r.data["other_cpu_share"] < 0.4 / psutil.cpu_count(), r.data["other_cpu_share"]
