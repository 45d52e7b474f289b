"""profile.stall: measured steps only, each stalled step named for what it was, machine contention told
from the script's own pauses. Fabricated step records and watchdog records; one real warm-up-heavy run."""

from __future__ import annotations

import pytest

from pitstop.findings import Severity
from pitstop.profile.analyze.stalls import stall_findings


def records(n=40, total=0.01, slow=None, warmup=5, **flags):
    slow = slow or {}
    out, t = [], 0.0
    for i in range(n):
        d = slow.get(i, total)
        rec = {"index": i, "start_s": t, "total_s": d, "warmup": i < warmup}
        rec.update({k: True for k, steps in flags.items() if i in steps})
        out.append(rec)
        t += d
    return out


def window(step, others=0.0, own=1.0, cpus=2, steal=0.0, waited=None):
    return {
        "step": step,
        "wall_s": 5.0,
        "cpus": cpus,
        "other_cpu_share": others / cpus,
        "steal_share": steal / cpus,
        "own_cpus": own,
        "runqueue_wait_s": waited,
    }


def sample(step, function="main_loop", module="__main__", where="train.py:30"):
    frames = [
        {"file": "train.py", "line": 30, "function": function, "module": module, "user": module == "__main__"}
    ]
    return {
        "step": step,
        "elapsed_s": 0.2,
        "main": {"where": where, "code": "", "call": None},
        "frames": frames,
    }


def stall(recs, **wd):
    found = stall_findings(recs, wd)
    return found[0] if found else None


def test_warm_up_steps_are_not_stalls():
    # steps 1-4 are warm-up (compilation, lazy init): 78% of a run's time, but not a stall
    assert stall(records(60, slow={1: 2.0, 2: 2.0, 3: 1.5, 4: 1.0})) is None
    # the same slow steps measured (no warm-up) are
    assert stall(records(60, slow={1: 2.0, 2: 2.0, 3: 1.5, 4: 1.0}, warmup=0)).data["steps"] == [1, 2, 3, 4]


def test_a_no_grad_pass_in_the_step_is_named_not_blamed_on_checkpoints():
    recs = records(40, slow={10: 1.0, 20: 1.0, 30: 1.0}, eval={10, 20, 30})
    f = stall(recs)
    assert (
        f.data["steps"] == [10, 20, 30]
        and "a no-grad pass (evaluation or sampling) every 10 steps" in f.title
    )
    assert (
        "Evaluate or sample less often" in f.fix
        and "checkpoint" not in f.fix.lower()
        and "gc" not in f.fix.lower()
    )


def test_a_sampled_callback_and_a_save_are_named():
    recs = records(40, slow={12: 1.0, 25: 2.0})
    cb = sample(12, function="SampleCallback.on_train_batch_end")
    save = sample(25, function="save", module="torch.serialization")
    f = stall(recs, samples=[cb, save])
    causes = f.data["causes"]
    assert causes["12"] == ["callback", "SampleCallback.on_train_batch_end"]
    assert causes["25"] == ["save", "torch.serialization.save"]
    assert "a checkpoint save" in f.title  # the costlier of the two leads
    assert "Run the callback less often" in f.fix and "Save checkpoints less often" in f.fix


def test_machine_contention_is_told_from_the_scripts_own_pauses():
    # 50-80 s steps while other processes held most of the 2 CPUs and the script's threads waited for one:
    # contention, not checkpoint/eval/GC
    recs = records(40, total=0.5, slow={13: 60.0, 17: 80.0, 31: 50.0})
    busy = [window(13, others=1.8, own=0.2, waited=3.0), window(17, others=1.9, own=0.1, waited=4.0)]
    f = stall(recs, contention=[*busy, window(31, others=1.7, waited=2.0)])
    assert f.title.endswith("machine contention")
    assert [c[0] for c in f.data["causes"].values()] == ["contention"] * 3
    assert (
        "other processes used 1.8 of 2 CPUs, the script 0.2, its threads waited 3.0 s for a CPU" in f.evidence
    )
    assert "not the script's own work" in f.fix and "checkpoint" not in f.fix.lower()
    assert "every" not in f.title  # no schedule
    # others busy, but the script's threads did not wait for a CPU (it slept, or blocked on I/O): not
    # contention; nothing else tells, so it is not guessed either
    asleep = [window(i, others=1.9, own=0.02, waited=0.01) for i in (13, 17, 31)]
    f = stall(recs, contention=asleep)
    assert f.title.endswith("cause not known") and "could not tell" in f.fix
    assert "checkpoint" not in f.fix.lower() and "contention" not in f.fix
    # where the kernel gives no run-queue time: full CPUs while the script worked
    assert stall(recs, contention=[window(13, others=1.2, own=0.8)]).data["causes"]["13"][0] == "contention"
    assert stall(recs, contention=[window(13, others=1.9, own=0.02)]).data["causes"]["13"][0] == "unknown"


def test_a_schedule_without_a_sample_is_a_periodic_pause():
    f = stall(records(40, slow={10: 1.0, 20: 1.0, 30: 1.0}))
    assert "a pause the loop makes every 10 steps" in f.title and "on a schedule" in f.fix
    # unsampled turns of a sampled periodic save are that save
    f = stall(records(40, slow={10: 1.0, 20: 1.0, 30: 1.0}), samples=[sample(20, function="save_checkpoint")])
    assert {tuple(c) for c in f.data["causes"].values()} == {("save", "save_checkpoint")}


def test_a_long_unsampled_step_is_never_called_too_short_to_catch():
    f = stall(records(40, slow={17: 7.38}), poll_s=0.25)
    assert "shorter than the watchdog could catch" not in f.evidence and "not sampled" in f.evidence
    f = stall(records(40, slow={17: 0.3}), poll_s=0.25)
    assert "shorter than the watchdog could catch (it looks every 0.25 s)" in f.evidence


def test_a_stall_is_not_capped_at_the_breakdowns_step():
    from pitstop.profile.analyze.rules import findings_for
    from pitstop.profile.record.timeline import StepRecord

    # the stalled steps hold an eval pass, so the breakdown (10 ms steps) leaves them out
    recs = records(40, slow={10: 1.0, 20: 1.0, 30: 1.0}, eval={10, 20, 30})
    steps = [StepRecord.from_dict(r) for r in recs if not r["warmup"]]
    found, bd = findings_for(steps, {"steps": recs}, cores=2)
    f = next(f for f in found if f.id == "profile.stall")
    assert bd.total_s == pytest.approx(0.01) and "capped" not in f.data
    assert f.est_saving_s == pytest.approx(3 * 0.99 / 35)


def test_share_counts_measured_steps_only():
    f = stall(records(45, slow={2: 5.0, 20: 3.0}, warmup=5))  # step 2 is warm-up
    assert f.data["steps"] == [20] and f.est_saving_s == pytest.approx((3.0 - 0.01) / 40)
    assert f.severity is Severity.WARN


WARMUP_HEAVY = """
import time
import torch

model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(200):
    if 0 < step < 5:
        time.sleep(0.3)  # slow first steps (lazy init, compilation): the warm-up
    x = torch.randn(16, 32)
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    if step % 8 == 0:  # a sampling callback after the optimizer step, from iteration 0 on
        model.eval()
        with torch.no_grad():
            for _ in range(5):
                x = model(x)
        model.train()
        time.sleep(0.6)  # CALLBACK
"""


@pytest.mark.slow
def test_warm_up_heavy_run_with_a_callback_books_it_to_its_step(tmp_path):
    import sys

    from pitstop.profile.runs.runner import RunSpec, run

    script = tmp_path / "warm.py"
    script.write_text(WARMUP_HEAVY)
    spec = RunSpec(command=[sys.executable, str(script)], steps=20, warmup=5, quiet=True, probes=False)
    report = run(spec, out_dir=tmp_path / "run").report()
    evals = [s["index"] for s in report.sections["steps"] if s["eval"]]
    assert evals == [0, 8, 16, 24]  # the callback of iteration i is in step i, not i + 1
    f = report.by_id("profile.stall")
    assert f is not None and f.data["steps"] == [8, 16, 24]  # warm-up steps 1-4 and step 0 are not stalls
    assert "no-grad pass" in f.title and "every 8 steps" in f.title
    assert "checkpoint" not in f.fix.lower()


def test_watchdog_median_leaves_out_the_warm_up_and_measures_the_load():
    import time

    from pitstop.profile.capture.watchdog import LoadWindow, median_step_s

    recs = records(8, slow={1: 2.0, 2: 2.0, 3: 2.0, 4: 2.0}, warmup=5)
    assert median_step_s(recs[:5]) == 2.0  # nothing measured yet: the warm-up after step 0 is all there is
    assert median_step_s(recs) == 0.01  # three measured steps: theirs
    w = LoadWindow(7, time.perf_counter()).close(time.perf_counter())
    assert w["step"] == 7 and w["cpus"] >= 1 and w["other_cpu_share"] >= 0 and w["own_cpus"] >= 0
    assert w["runqueue_wait_s"] is None or w["runqueue_wait_s"] >= 0


def test_a_step_that_waited_for_its_batch_is_named_so():
    recs = records(40, slow={12: 1.0, 24: 1.0, 36: 1.0})
    for r in recs:
        r["data_wait_s"] = 0.9 if r["index"] in (12, 24, 36) else 0.002
    f = stall(recs)  # every 12 steps: a new epoch's workers starting
    assert f.title.endswith("waiting for data every 12 steps") and "persistent_workers=True" in f.fix
    assert f.data["causes"]["12"] == ["data", "900 ms of it"]
