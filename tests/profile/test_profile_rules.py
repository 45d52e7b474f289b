"""Rules: measurements in, ranked findings out. Synthetic measurements, no child process."""

from __future__ import annotations

import pytest

from pitstop.findings import Severity
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.capture.facts import GpuSampler
from pitstop.profile.record.timeline import StepRecord, breakdown


def steps(n=10, total=0.1, **parts) -> list[StepRecord]:
    return [StepRecord(index=i, start_s=i * total, total_s=total, **parts) for i in range(n)]


def loader(**kw):
    d = {
        "location": "train.py:12",
        "num_workers": 0,
        "pin_memory": False,
        "persistent_workers": False,
        "batch_size": 32,
        "batches_seen": 10,
        "batches_per_epoch": 100,
        "wait_s": 0.5,
        "first_batch_s": [0.05],
        "iterators": 1,
    }
    d.update(kw)
    return d


def ids(found):
    return [f.id for f in sorted(found, key=lambda f: (-f.severity.rank, -(f.est_saving_s or 0.0), f.id))]


def test_breakdown_parts_add_up_to_the_step():
    bd = breakdown(
        steps(total=0.1, data_wait_s=0.03, forward_s=0.02, backward_s=0.03, optimizer_s=0.01, sync_s=0.005)
    )
    assert abs(sum(bd.parts.values()) - 0.1) < 1e-12
    assert abs(bd.parts["other_s"] - 0.005) < 1e-12
    assert bd.share("data_wait_s") == 0.3


def test_data_wait_ranks_first_with_its_measured_cost():
    data = {
        "loaders": [loader(wait_s=0.6)],
        "sync_sites": [
            {
                "location": "train.py:30",
                "method": "item",
                "count": 11,
                "measured_count": 10,
                "time_s": 0.01,
                "loop_gap_s": 0.0,
            }
        ],
        "probes": {"precision": {"dtype": "bfloat16", "base_s": 0.04, "new_s": 0.03, "saving_s": 0.01}},
        "models": [{"param_dtypes": ["float32"], "first_location": "train.py:20"}],
    }
    found, _ = findings_for(
        steps(total=0.1, data_wait_s=0.06, forward_s=0.02, syncs=1, sync_s=0.001), data, cores=8
    )
    order = ids(found)
    assert order[0] == "dataloader.workers"
    top = next(f for f in found if f.id == "dataloader.workers")
    assert abs(top.est_saving_s - 0.06) < 1e-9 and abs(top.share - 0.6) < 1e-9
    # recipes.workers.choose_workers: 8 cores, one left to the training process
    assert top.location == "train.py:12" and "num_workers=7" in top.fix_code
    assert order.index("precision.amp") < order.index("sync.item")  # 10 ms beats 1 ms
    assert "summary.healthy" not in order


def test_all_workers_busy_is_a_different_finding():
    found, _ = findings_for(steps(data_wait_s=0.06), {"loaders": [loader(num_workers=8)]}, cores=8)
    assert "dataloader.workers" not in ids(found) and "dataloader.slow" in ids(found)
    # 60% of the step, but no run can time a change to the input pipeline: info, saying why
    slow = next(f for f in found if f.id == "dataloader.slow")
    assert (
        slow.severity is Severity.INFO
        and slow.est_saving_s == pytest.approx(0.06)
        and slow.data["confirmed"] is False
    )
    assert "not confirmed" in slow.evidence and "pitstop cannot inject" in slow.evidence


def test_healthy_run_says_so_and_raises_nothing():
    data = {
        "loaders": [loader(wait_s=0.001)],
        "models": [{"param_dtypes": ["float32"], "autocast": True, "compiled": True}],
        "probes": {},
    }
    found, _ = findings_for(steps(data_wait_s=0.0001, forward_s=0.05, backward_s=0.04), data, cores=8)
    assert [f.severity for f in found] == [Severity.INFO]
    assert found[0].id == "summary.healthy"


def test_probe_without_gain_is_a_pass_only_when_its_interval_rules_a_gain_out():
    no_gain = {"dtype": "bfloat16", "base_s": 0.05, "new_s": 0.051, "saving_s": -0.001}
    data = {
        "models": [{"param_dtypes": ["float32"], "conv2d_layers": 3, "compiled": True}],
        "probes": {
            # the saving's upper bound (2 ms) is under 5% of the 100 ms step: decided, a pass
            "precision": {**no_gain, "saving_lo_s": -0.004, "saving_hi_s": 0.002},
            "channels_last": {
                "base_s": 0.05,
                "new_s": 0.03,
                "saving_s": 0.02,
                "saving_lo_s": 0.015,
                "saving_hi_s": 0.025,
            },
        },
    }
    found, _ = findings_for(steps(forward_s=0.05), data, cores=2)
    by = {f.id: f for f in found}
    assert by["precision.amp"].severity is Severity.PASS
    assert by["precision.amp"].data["verdict"] == "no gain"
    assert by["precision.amp"].data["saving_ci_s"] == [-0.004, 0.002]
    assert by["memory_format.channels_last"].severity is Severity.WARN
    assert abs(by["memory_format.channels_last"].share - 0.2) < 1e-9
    # the same point estimate without an interval, or with one reaching the bar (5 ms): undecided, not a pass
    for probe in (no_gain, {**no_gain, "saving_lo_s": -0.004, "saving_hi_s": 0.006}):
        found, _ = findings_for(steps(forward_s=0.05), {**data, "probes": {"precision": probe}}, cores=2)
        amp = next(f for f in found if f.id == "precision.amp")
        assert amp.severity is Severity.INFO and amp.data["verdict"] == "undecided", amp
        assert amp.est_saving_s is None and "pitstop fix --candidates amp" in amp.fix
        assert all(f.severity is not Severity.PASS for f in found)


def test_sync_loop_cost_includes_the_loop_between_calls():
    sites = [
        {
            "location": "t.py:9",
            "method": "item",
            "count": 2600,
            "measured_count": 2560,
            "time_s": 0.0025,
            "loop_gap_s": 0.05,
        }
    ]
    # the hooks put both the calls and the loop between them in the step's sync part
    found, _ = findings_for(
        steps(n=10, total=0.02, syncs=256, sync_s=0.00525), {"sync_sites": sites}, cores=2
    )
    f = next(f for f in found if f.id == "sync.item")
    assert abs(f.est_saving_s - 0.00525) < 1e-9 and abs(f.share - 0.2625) < 1e-9
    assert f.data["loop_s"] == 0.005 and f.data["sync_s"] == 0.00025
    assert f.severity is Severity.WARN and ".tolist()" in f.fix_code and f.location == "t.py:9"
    # the same sync part in every block of steps: its interval confirms the warning
    assert f.data["confirmed"] is True and f.data["saving_ci_s"] == pytest.approx([0.00525, 0.00525])


def test_a_sync_part_in_one_stretch_of_the_run_is_not_a_warning():
    sites = [{"location": "t.py:9", "method": "item", "count": 30, "measured_count": 30, "time_s": 0.03}]
    # 12 steps, all the sync time in the first three: 2.5 ms on average, 12.5% of the step
    run = [
        StepRecord(index=i, start_s=i * 0.02, total_s=0.02, syncs=1, sync_s=0.01 if i < 3 else 0.0)
        for i in range(12)
    ]
    found, _ = findings_for(run, {"sync_sites": sites}, cores=2)
    f = next(f for f in found if f.id == "sync.item")
    assert f.share >= 0.05 and f.severity is Severity.INFO and f.data["confirmed"] is False
    assert f.data["saving_ci_s"][0] < 0.05 * 0.02 and "not confirmed" in f.evidence


def test_cuda_only_rules_with_fake_measurements():
    data = {
        "device": "cuda:0",
        "loaders": [loader(wait_s=0.0, num_workers=4, persistent_workers=True)],
        "models": [{"dataparallel": True, "param_dtypes": ["float16"], "compiled": True}],
        "gpu_util": {"index": 0, "mean_util_pct": 41.0, "samples": 30, "window": "measured steps"},
        "optimizers": [{"type": "Adam", "impl": "for-loop", "params": 10}],
    }
    found, _ = findings_for(steps(h2d_s=0.02, forward_s=0.05), data, cores=8)
    by = {f.id: f for f in found}
    assert abs(by["dataloader.pin_memory"].est_saving_s - 0.02) < 1e-9
    assert by["parallel.dataparallel"].severity is Severity.WARN
    assert by["gpu.idle"].severity is Severity.WARN and "41%" in by["gpu.idle"].title
    assert by["optimizer.foreach"].est_saving_s is None  # not probed: no claimed saving
    # a measured cost, but no run times its fix (pinning alone does not overlap the copies): info, saying so
    pin = by["dataloader.pin_memory"]
    assert (
        pin.severity is Severity.INFO and pin.data["confirmed"] is False and pin.data["saving_ci_s"] is None
    )
    assert "not confirmed" in pin.evidence and "non_blocking=True copy is a code change" in pin.evidence


def test_persistent_workers_cost_is_the_restart_amortised():
    ld = loader(
        num_workers=2,
        wait_s=0.2,
        batches_seen=20,
        first_batch_s=[0.51, 0.51],
        iterators=2,
        batches_per_epoch=10,
    )
    found, _ = findings_for(steps(n=20, data_wait_s=0.01), {"loaders": [ld]}, cores=2)
    f = next(f for f in found if f.id == "dataloader.persistent_workers")
    assert abs(f.est_saving_s - 0.05) < 1e-9  # (0.51 - 0.01) s per restart / 10 batches per epoch
    # half the step, read off the first batches rather than measured with the fix: info, saying so
    assert f.severity is Severity.INFO and f.data["saving_ci_s"] is None
    assert "not measured with the fix" in f.evidence and "--candidates persistent_workers" in f.evidence


def test_no_step_reports_what_was_measured():
    found, bd = findings_for([], {"totals": {"batches": 7, "data_wait_s": 1.5, "forwards": 7}})
    assert bd is None and [f.id for f in found] == ["profile.no_step"]
    assert "7 batches" in found[0].evidence


def test_gpu_sampler_averages_over_the_measured_window():
    g = GpuSampler(0, t0=100.0)
    g.samples = [(100.5, 10.0), (101.5, 80.0), (102.5, 60.0), (110.0, 0.0)]
    recs = [
        {"warmup": True, "start_s": 0.0, "total_s": 1.0},
        {"warmup": False, "start_s": 1.0, "total_s": 1.0},
        {"warmup": False, "start_s": 2.0, "total_s": 1.0},
    ]
    s = g.summary(recs)
    assert s["mean_util_pct"] == 70.0 and s["window"] == "measured steps" and s["samples"] == 2


def test_page_fault_probe_gives_a_measured_cost_or_a_pass():
    probe = {"base_s": 0.05, "new_s": 0.04, "saving_s": 0.01, "base_faults": 3000, "new_faults": 0}
    found, bd = findings_for(
        steps(forward_s=0.05, minor_faults=4000), {"probes": {"host_memory": probe}}, cores=2
    )
    assert bd.faults_per_step == 4000
    # faults vary by step (glibc's dynamic mmap threshold): a step's cost is their mean, not their median
    varied = [
        StepRecord(index=i, start_s=i * 0.1, total_s=0.1, minor_faults=m) for i, m in enumerate([0, 0, 3000])
    ]
    assert breakdown(varied).faults_per_step == 1000
    f = next(f for f in found if f.id == "host.page_faults")
    # 10 ms for 3,000 faults in the probe, 4,000 faults a step in the run: 13.3 ms of the 100 ms step,
    # but measured before then after in one process, so not confirmed: info.
    assert (
        f.severity is Severity.INFO
        and "not confirmed" in f.evidence
        and f.data["saving_ci_s"] is None
        and abs(f.est_saving_s - 0.04 / 3) < 1e-9
        and abs(f.share - 0.4 / 3) < 1e-9
    )
    assert "4,000 minor page faults per step" in f.evidence and "keep_host_memory()" in f.fix_code
    # The probe's heap state is not the run's: a run that faults 20 times a step is charged for 20, and
    # 20 faults at the most one can cost (200 us) are under 5% of the step: a pass. 150 are not ruled
    # out by that bound, and the probe has no interval: undecided, the run still healthy.
    for faults, severity in ((20, Severity.PASS), (150, Severity.INFO)):
        found, _ = findings_for(
            steps(forward_s=0.05, minor_faults=faults), {"probes": {"host_memory": probe}}, cores=2
        )
        f = next(f for f in found if f.id == "host.page_faults")
        assert f.severity is severity and "summary.healthy" in [g.id for g in found]
    assert f.data["verdict"] == "undecided" and "pitstop fix --candidates host_memory" in f.fix
    # 3,000 faults fewer and no time saved: cheap by the point estimate, but not a pass without an interval
    flat = {**probe, "new_s": 0.0499, "saving_s": 0.0001}
    found, _ = findings_for(
        steps(forward_s=0.05, minor_faults=4000), {"probes": {"host_memory": flat}}, cores=2
    )
    assert next(f for f in found if f.id == "host.page_faults").severity is Severity.INFO
    # The probe's heap took no faults, so one fault's cost is unknown; the run's 4,000 a step are worth a
    # `pitstop fix` run (and `pitstop fix` picks the finding up), 10 a step are not.
    untimed = {**flat, "base_faults": 0}
    found, _ = findings_for(
        steps(forward_s=0.05, minor_faults=4000), {"probes": {"host_memory": untimed}}, cores=2
    )
    f = next(f for f in found if f.id == "host.page_faults")
    assert f.severity is Severity.INFO and f.est_saving_s is None and "pitstop fix" in f.evidence
    found, _ = findings_for(
        steps(forward_s=0.05, minor_faults=10), {"probes": {"host_memory": untimed}}, cores=2
    )
    assert next(f for f in found if f.id == "host.page_faults").severity is Severity.PASS
    # Skipped because malloc already keeps freed memory (the script's keep_host_memory, a preloaded
    # jemalloc): a pass that says why. Skipped for any other reason (not glibc): no finding.
    kept = {
        "skipped": "the script already called keep_host_memory: glibc keeps freed blocks up to 1024 MiB mapped",
        "kept": True,
    }
    found, _ = findings_for(steps(minor_faults=3), {"probes": {"host_memory": kept}}, cores=2)
    f = next(f for f in found if f.id == "host.page_faults")
    assert (
        f.severity is Severity.PASS
        and "keep_host_memory" in f.evidence
        and "3 minor page faults" in f.evidence
    )
    je = {"skipped": "jemalloc is preloaded and keeps freed memory", "kept": True}
    found, _ = findings_for(steps(), {"probes": {"host_memory": je}}, cores=2)
    assert next(f for f in found if f.id == "host.page_faults").evidence.startswith("jemalloc is preloaded")
    # Not glibc, or malloc configured by the user's MALLOC_*_ variables (not known to keep memory): nothing.
    for reason in (
        "off: the C library is not glibc",
        "off: malloc already configured by MALLOC_TRIM_THRESHOLD_",
    ):
        found, _ = findings_for(
            steps(), {"probes": {"host_memory": {"skipped": reason, "kept": False}}}, cores=2
        )
        assert not any(f.id == "host.page_faults" for f in found)
