"""Contention as a finding: the thread probe (threads vs the cores other work leaves free), its rule
(host.oversubscribed / host.contention, severity by the interval on both sides), and the note every
other finding gets where the run was measured while other work used the CPUs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from pitstop.findings import Severity
from pitstop.host import load
from pitstop.host.load import Competition
from pitstop.profile.analyze.contention_rules import CONTENTION, NOTED, OVERSUBSCRIBED, contention_findings
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.probe import thread_probe
from pitstop.profile.record.timeline import StepRecord, breakdown

BUSY = Competition(
    seconds=1.0, usable_cores=2, cpus=2, other_busy_cores=1.1, steal_cores=0.0, other_runnable=1.4
)


def _steps(total=0.1, fwd=0.04, bwd=0.05, wait=0.0, n=8):
    return [
        StepRecord(index=i, start_s=i * total, total_s=total, forward_s=fwd, backward_s=bwd, data_wait_s=wait)
        for i in range(n)
    ]


def _record(base, new, lo, hi, threads=2, fit=1, rounds=5):
    """A thread probe record as ``thread_probe.run`` writes it, with a speed-up interval [lo, hi]."""
    return {
        "threads": threads,
        "fit": fit,
        "local_ranks": 1,
        "usable_cores": 2,
        "competition": BUSY.to_dict(),
        "base_s": base,
        "new_s": new,
        "saving_s": base - new,
        "saving_lo_s": base - base / lo,
        "saving_hi_s": base - base / hi,
        "interval": {"estimate": base / new, "lo": lo, "hi": hi, "rounds": rounds},
        "interval_text": f"{base / new:.2f}x (95% CI {lo:.2f}\u2013{hi:.2f}, {rounds} rounds)",
    }


# busy until its parent (this test process) is gone, so a burner never outlives the test run
BURN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"


def _find(fid, steps, data):
    return next((f for f in findings_for(steps, data, cores=2)[0] if f.id == fid), None)


def test_other_processes_taking_the_cores_is_a_warning_when_the_interval_clears_the_bar():
    data = {"probes": {"threads": _record(0.09, 0.01, lo=4.0, hi=12.0)}}
    f = _find(CONTENTION, _steps(), data)
    assert f is not None and f.severity is Severity.WARN and f.data["confirmed"] is True
    assert f.est_saving_s == pytest.approx(0.08) and "other processes took the cores" in f.title
    assert "torch.set_num_threads(1)" in f.fix_code and "OMP_NUM_THREADS=1" in f.fix
    assert "other processes kept 1.1 of 2 usable cores busy" in f.evidence and "confirmed" in f.evidence
    # the script's own threads beyond the usable cores are oversubscription, measured the same way
    data = {"probes": {"threads": _record(0.09, 0.01, lo=4.0, hi=12.0, threads=8, fit=2)}}
    f = _find(OVERSUBSCRIBED, _steps(), data)
    assert f.severity is Severity.WARN and "more intra-op threads than usable cores" in f.title


def test_an_interval_that_does_not_clear_the_bar_is_undecided_and_says_what_decides_it():
    # point estimate 50% of the step, but the interval reaches down to no gain: info, not a warning
    data = {"probes": {"threads": _record(0.09, 0.04, lo=0.95, hi=5.0)}}
    f = _find(CONTENTION, _steps(), data)
    assert f.severity is Severity.INFO and f.data["confirmed"] is False
    assert "not confirmed" in f.evidence and "pitstop compare" in f.fix
    assert "`pitstop fix --candidates threads` times the whole script at 1 thread " in f.fix


def test_a_pass_needs_the_upper_bound_and_the_untimed_rest_below_the_bar():
    # fewer threads no faster (interval wholly around 1) on a step that is all forward+backward: pass
    data = {"probes": {"threads": _record(0.09, 0.09, lo=0.97, hi=1.02)}}
    f = _find(CONTENTION, _steps(total=0.1, fwd=0.05, bwd=0.05), data)
    assert f.severity is Severity.PASS and "would not save" in f.title
    # the same probe on a step that is mostly data loading in the process (untimed by the probe, on the
    # same threads): the rest could gain at the upper bound's rate, so it is undecided, not a pass
    data = {"probes": {"threads": _record(0.09, 0.03, lo=1.5, hi=6.0)}}
    f = _find(CONTENTION, _steps(total=2.6, fwd=0.05, bwd=0.05, wait=2.5), data)
    assert f.severity is Severity.INFO and "was not timed" in f.evidence


def test_no_finding_where_the_threads_fit_and_unmeasured_workers_are_info():
    quiet = Competition(seconds=1.0, usable_cores=2, cpus=2, other_busy_cores=0.0, steal_cores=0.0)
    rec = {"threads": 2, "fit": 2, "local_ranks": 1, "usable_cores": 2, "competition": quiet.to_dict()}
    found = findings_for(_steps(), {"probes": {"threads": rec}}, cores=2)[0]
    assert not [f for f in found if f.area == "host"]
    loaders = [{"num_workers": 4, "batches_seen": 10, "wait_s": 0.0}]
    f = _find(OVERSUBSCRIBED, _steps(), {"probes": {"threads": rec}, "loaders": loaders})
    assert f.severity is Severity.INFO and "4 DataLoader worker processes" in f.evidence
    assert f.est_saving_s is None and "workers stopped" in f.evidence


def test_every_other_finding_says_it_was_measured_under_contention():
    steps = _steps(total=0.1, fwd=0.02, bwd=0.02, wait=0.06)
    loaders = [{"num_workers": 0, "batches_seen": 10, "wait_s": 0.6, "location": "train.py:3"}]
    busy = {"loaders": loaders, "other_cpu_share": 0.45, "steal_share": 0.02}
    f = _find("dataloader.workers", steps, busy)
    assert "measured under contention: other processes used at least 45% of the CPUs" in f.evidence
    assert "stole 2%" in f.evidence and f.data[NOTED]["other_cpu_share"] == 0.45
    quiet = _find("dataloader.workers", steps, {"loaders": loaders, "other_cpu_share": 0.02})
    assert "contention" not in quiet.evidence and NOTED not in quiet.data


def test_rule_reads_the_threads_from_the_run_when_the_probe_did_not_run():
    assert contention_findings(breakdown(_steps()), {"torch": {"num_threads": 2}}, 2) == []


def _tiny():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    return model, ((torch.randn(16, 32),), {})


def test_probe_times_fewer_threads_when_the_script_oversubscribes_and_restores_its_count():
    model, inputs = _tiny()
    before = torch.get_num_threads()
    torch.set_num_threads(load.usable_cores() + 2)  # more than the cores: a smaller count always fits
    try:
        rec = thread_probe.run(model, inputs, {}, budget_s=2.0)["threads"]
        assert torch.get_num_threads() == load.usable_cores() + 2  # process-wide: restored
    finally:
        torch.set_num_threads(before)
    assert rec["threads"] == load.usable_cores() + 2 and 1 <= rec["fit"] <= load.usable_cores()
    assert rec["base_s"] > 0 and rec["new_s"] > 0 and rec["interval"]["rounds"] >= 2
    assert rec["competition"]["seconds"] >= rec["window"]["seconds"]
    # a GPU model or no batch: nothing to probe
    assert thread_probe.run(model, None, {}) == {} and thread_probe.run(None, inputs, {}) == {}


def _burning(procs: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """Wait until every burner is past its interpreter's start-up and spinning (a busy machine can take a
    while to start them), so the probe's short window sees them burn."""
    import psutil

    deadline = time.monotonic() + timeout_s
    for p in procs:
        proc = psutil.Process(p.pid)
        start = sum(proc.cpu_times()[:2])
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if sum(proc.cpu_times()[:2]) - start > 0.1:
                break


@contextlib.contextmanager
def _burners(n: int, cpus: set[int]):
    """``n`` busy processes outside this process tree, pinned to ``cpus``; killed on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True) for _ in range(n)]
    try:
        for p in procs:
            os.sched_setaffinity(p.pid, cpus)
        _burning(procs)
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_probe_sees_a_hog_on_its_cores_and_fits_its_threads_to_what_is_left():
    """Two busy processes pinned to this process's two CPUs: the meter counts them as other work on its
    cores, and the probe sizes its threads below the script's 2 and times both counts."""
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("needs two CPUs")
    two = set(sorted(mine)[:2])
    before = torch.get_num_threads()
    model, inputs = _tiny()
    os.sched_setaffinity(0, two)
    try:
        torch.set_num_threads(2)
        with _burners(2, two):
            rec = thread_probe.run(model, inputs, {}, budget_s=2.0)["threads"]
        assert torch.get_num_threads() == 2
    finally:
        os.sched_setaffinity(0, mine)
        torch.set_num_threads(before)
    seen = rec["window"]
    assert seen["cpus"] == 2 and seen["other_busy_cores"] + (seen["other_runnable"] or 0) > 0.5, seen
    assert rec["fit"] == 1 and "base_s" in rec and "new_s" in rec, rec


def test_competition_text_and_fitting_threads():
    assert (
        load.fitting_threads(0.0) == 1
        and load.fitting_threads(1.6) == 2
        and load.fitting_threads(7.9, 2) == 4
    )
    assert BUSY.free_cores == pytest.approx(0.6) and BUSY.taken_cores == pytest.approx(1.4)
    assert Competition.from_dict(BUSY.to_dict()) == BUSY
    assert "1.4 other runnable tasks" in BUSY.text()


def test_proc_stat_parse(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  300 0 100 900 10 0 0 50 0 0\ncpu0 200 0 50 400 5 0 0 30 0 0\ncpu1 100 0 50 500 5 0 0 20 0 0\n"
        "intr 1 2\nprocs_running 5\nprocs_blocked 0\n"
    )
    t = load.read_proc_stat(stat)
    hz = os.sysconf("SC_CLK_TCK")
    assert t.busy_s == {0: 250 / hz, 1: 150 / hz} and t.steal_s == {0: 30 / hz, 1: 20 / hz}
    assert t.procs_running == 5 and load.read_proc_stat(tmp_path / "missing") is None
    task = tmp_path / "task" / "7"
    task.mkdir(parents=True)
    (task / "stat").write_text("7 (a (b) c) R 1 2 3")
    (task / "schedstat").write_text("100 2500000000 3")
    assert load.own_runnable_threads(tmp_path / "task") == 1
    assert load.own_wait_s(tmp_path / "task") == pytest.approx(2.5)


def test_probe_loads_a_batch_as_the_main_process_did_and_the_rule_counts_it_timed():
    from torch.utils.data import DataLoader, TensorDataset

    from pitstop.profile.record.captured import CapturedLoader

    ds = TensorDataset(torch.randn(40, 32))
    calls = []

    def collate(items):
        calls.append(len(items))
        return torch.stack([t for (t,) in items])

    main = CapturedLoader(DataLoader(ds, batch_size=8, collate_fn=collate), {}, ds, "train.py:9", batches=3)
    workers = CapturedLoader(DataLoader(ds, batch_size=8, num_workers=2), {}, ds, "train.py:5", batches=3)
    assert (
        thread_probe.main_process_batch([workers]) is None and thread_probe.main_process_batch(None) is None
    )
    batch, where = thread_probe.main_process_batch([workers, main])
    assert where == "train.py:9" and batch().shape == (8, 32) and calls == [8]
    model, inputs = _tiny()
    before = torch.get_num_threads()
    rec = thread_probe.run(model, inputs, {}, budget_s=1.0, loaders=[main])["threads"]
    assert rec["loader_location"] == "train.py:9" and len(calls) > 1  # every pass loaded a batch

    # the script removed its data on the way out: the probe times the rest and says why
    class Gone(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise FileNotFoundError("/tmp/data/0.jpg")

    gone = CapturedLoader(DataLoader(Gone(), batch_size=2), {}, Gone(), "train.py:9", batches=3)
    torch.set_num_threads(load.usable_cores() + 1)  # oversubscribed: the A/B always runs
    try:
        rec = thread_probe.run(model, inputs, {}, budget_s=1.0, loaders=[gone])["threads"]
    finally:
        torch.set_num_threads(before)
    assert "FileNotFoundError" in rec["loader_error"] and "loader_location" not in rec and "base_s" in rec
    f = _find(OVERSUBSCRIBED, _steps(), {"probes": {"threads": rec}})
    assert "not loading a batch: loading a batch failed: FileNotFoundError" in f.evidence
    # a step that is mostly data wait: timed by the probe when it loaded a batch, so a tight interval
    # around no gain is a pass; untimed, the wait could gain at the upper bound's rate: undecided
    steps = _steps(total=2.6, fwd=0.05, bwd=0.05, wait=2.5)
    rec = {**_record(2.6, 2.6, lo=0.98, hi=1.01), "loader_location": "train.py:9"}
    assert _find(CONTENTION, steps, {"probes": {"threads": rec}}).severity is Severity.PASS
    rec = _record(0.1, 0.1, lo=0.9, hi=1.5)
    assert _find(CONTENTION, steps, {"probes": {"threads": rec}}).severity is Severity.INFO


def test_the_runs_share_of_other_work_reaches_every_ranks_data():
    from types import SimpleNamespace

    from pitstop.profile.runs.runner import note_other_cpu

    other = SimpleNamespace(share=lambda session: 0.31, steal_share=lambda: 0.05)
    ranks = {0: SimpleNamespace(data={}), 1: SimpleNamespace(data={})}
    result = SimpleNamespace(data={}, ranks=ranks)
    note_other_cpu(result, other, 123)
    assert result.data == {"other_cpu_share": 0.31, "steal_share": 0.05}
    assert all(r.data == result.data for r in ranks.values())


TRAIN = """
import torch
from torch import nn
torch.set_num_threads(2)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 64), torch.randint(0, 4, (64,))
for _ in range(400):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_profile_with_a_hog_on_the_scripts_cores_names_contention(tmp_path):
    """End to end: a script with 2 threads on 2 CPUs that two busy processes also run on. The profile's
    thread probe times 1 thread against 2 and the report has the contention finding (its severity is the
    interval's: no timing is asserted); the run's share of other work is measured, and where it reaches
    the note's threshold every other finding says so."""
    from pitstop.profile.runs.runner import RunSpec, run

    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("needs two CPUs")
    two = set(sorted(mine)[:2])
    (tmp_path / "train.py").write_text(TRAIN)
    os.sched_setaffinity(0, two)  # the script's process inherits it
    try:
        with _burners(2, two):
            r = run(
                RunSpec(command=[sys.executable, str(tmp_path / "train.py")], steps=6, warmup=2, quiet=True)
            )
    finally:
        os.sched_setaffinity(0, mine)
    assert r.status == "stopped", r.error
    rec = r.data["probes"]["threads"]
    assert rec["threads"] == 2 and rec["fit"] == 1 and "base_s" in rec, rec
    report = r.report()
    f = report.by_id(CONTENTION)
    assert f is not None and f.data["fit"] == 1 and "2 threads" in f.evidence
    assert f.severity is Severity.PASS or "torch.set_num_threads(1)" in f.fix_code
    others = [g for g in report.findings if g.id != CONTENTION and g.area != "summary"]
    if r.data["other_cpu_share"] >= 0.1:
        assert others and all("measured under contention" in g.evidence for g in others)
