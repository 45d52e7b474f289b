"""The typed parts of the measurements record (``record.parts``) and the child writing its record from
them (``capture.snapshot``): each part reads its JSON and gives the same JSON back."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from pitstop.profile.analyze.probe_failures import probe_failure_rules
from pitstop.profile.record.measurements import Measurements
from pitstop.profile.record.parts import (
    DeviceTime,
    MemoryRecord,
    OptimizerRecord,
    ProbeResult,
    Probes,
    Totals,
    TraceRecord,
    WatchdogRecord,
)
from pitstop.profile.record.rank_summary import RankSummary

PROBE = {
    "base_s": 0.02,
    "new_s": 0.015,
    "saving_s": 0.005,
    "saving_lo_s": None,  # a bound the interval could not give: written as null, kept as null
    "saving_hi_s": 0.008,
    "budget_s": 6.0,
    "rounds": 3,
    "interval": {"lo": 0.9, "hi": 1.6},
    "interval_text": "x",
    "two_process": {"kept": True},  # a key the record does not name
}
PROBES = {
    "device_type": "cpu",
    "pass_s": 0.02,
    "skipped": ["model: too large"],
    "precision": {"dtype": "bfloat16", "skipped": "slow", "slower": True},
    "channels_last": PROBE,
    "optimizer": [{"type": "Adam", "location": "t.py:9", **PROBE}, {"type": "SGD", "error": "boom"}],
    "host_memory": {"error": "E"},
}
PARTS = [
    (Totals, {"batches": 3, "forwards": 4, "data_wait_s": 0.1, "optimizer_steps": 2, "later": 1}),
    (
        OptimizerRecord,
        {
            "type": "SGD",
            "location": "t.py:3",
            "foreach": None,
            "fused": None,
            "impl": "for-loop",
            "params": 2,
        },
    ),
    (MemoryRecord, {"peak_rss_bytes": 1, "cuda_peak_reserved_bytes": 8, "oom": None}),
    (ProbeResult, PROBE),
    (Probes, PROBES),
    (WatchdogRecord, {"run_status": "completed", "samples": [{"step": 3}], "stop": None, "hangs": []}),
    (DeviceTime, {"steps": [{"index": 1, "busy_s": 0.1}], "error": None, "anchored": True}),
    (TraceRecord, {"path": None, "steps": 2, "top_ops": [], "analysis": {"idle": []}}),
]


@pytest.mark.parametrize(("cls", "js"), PARTS, ids=[c.__name__ for c, _ in PARTS])
def test_each_part_round_trips_its_json(cls, js):
    rec = cls.from_json(js)
    assert rec.to_json() == js  # every key, nulls and keys the record does not name included
    assert cls.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    assert cls.of(rec) is rec and cls.of(js) == rec


def test_parts_read_typed():
    assert Totals.from_json(PARTS[0][1]).batches == 3 and Totals.from_json(PARTS[0][1]).extra == {"later": 1}
    probes = Probes.from_json(PROBES)
    cl = probes.result("channels_last")
    assert (
        cl is not None
        and cl.timed
        and cl.saving_hi_s == 0.008
        and cl.extra == {"two_process": {"kept": True}}
    )
    assert probes.result("nothing") is None and probes.result(None) is None
    assert [o.type for o in probes.optimizer] == ["Adam", "SGD"] and probes.optimizer[1].error == "boom"
    assert probes.skipped == ["model: too large"] and probes.extra == {"pass_s": 0.02}
    assert not ProbeResult.from_json({"skipped": "x"}).timed


def test_measurements_reads_its_parts_typed():
    m = Measurements.from_json(
        {
            "totals": {"batches": 3},
            "optimizers": [{"type": "SGD"}],
            "memory": {"peak_rss_bytes": 1},
            "probes": PROBES,
            "watchdog": {"run_status": "timeout"},
            "device_time": {"steps": []},
            "trace": {"analysis": {"steps": 2}},
        }
    )
    assert m.run_totals.batches == 3 and m.optimizers[0].type == "SGD" and m.memory is not None
    assert m.probed.result("channels_last") == ProbeResult.from_json(PROBE)
    assert m.watchdog is not None and m.watchdog.run_status == "timeout"
    assert m.trace is not None and m.trace.analysis == {"steps": 2}
    assert m.probe_results == PROBES  # the recipes' components read it by key
    assert Measurements().probed == Probes() and Measurements().run_totals == Totals()


def test_the_writer_keeps_its_nulls_the_parent_leaves_them_out():
    built = Measurements.build(status="completed", device=None, step_boundary=None)
    assert built.to_json()["device"] is None and built.to_json()["step_boundary"] is None
    assert "device" not in Measurements.from_json(built.to_json()).to_json()


def test_probe_failures_read_the_typed_probes():
    found = probe_failure_rules(Probes.from_json(PROBES))
    assert [f.id for f in found].count("profile.probe_failed") == 2  # the SGD probe, host memory
    assert found == probe_failure_rules(PROBES)  # the JSON reads the same


def test_the_child_writes_the_record_the_parent_reads(instrument):
    inst = instrument()
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(8):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    inst.close_pending()
    rec = inst.record("completed", final=False)
    snap = inst.snapshot("completed", final=False)
    assert snap == json.loads(json.dumps(rec.to_json())) | {"wall_s": snap["wall_s"]}
    assert snap["device"] is None and snap["gpu_util"] is None  # written as null, as before
    m = Measurements.from_json(snap)
    assert m.run_totals.optimizer_steps == 8 and m.run_totals.forwards == 8
    assert m.optimizers[0].type == "SGD" and m.memory is not None and m.memory.peak_rss_bytes
    assert m.loaders == () and m.steps == inst.records


RANK = {
    "rank": 1,
    "status": "stopped",
    "error": None,
    "host": "h",
    "local_rank": 1,
    "node_rank": 0,
    "world_size": 2,
    "measured_steps": 10,
    "breakdown": {
        "mean_step_s": 0.1,
        "median_step_s": 0.1,
        "forward_s": 0.02,
        "backward_s": 0.05,
        "other_s": 0.03,
    },
    "comm_per_step": {
        "collective_s": 0.01,
        "ddp_comm_s": 0.02,
        "ddp_exposed_s": 0.005,
        "ddp_rounds": 1.0,
        "unused_search_s": 0.0,
        "ddp_bytes": 1024.0,
        "ddp_timed_rounds": 1.0,
    },
    "steps": [{"index": 0, "total_s": 0.1}],
    "comm_steps": {"0": {"collective_s": 0.01}},
    "collective_sites": [],
    "ddp": [{"location": "t.py:9"}],
    "backend": "gloo",
    "devices": ["cpu"],
    "env": {},
    "process": {"intra_op_threads": 4},
    "signal": None,
    "state": None,
}


def test_rank_summary_round_trips_and_reads_typed():
    s = RankSummary.from_json(RANK)
    assert s.to_json() == RANK
    assert s.measured and s.step_s == 0.1 and s.comm_per_step.wait_s == pytest.approx(0.015)
    assert (
        s.breakdown is not None and s.breakdown.part("forward_s") == 0.02 and s.breakdown.part("h2d_s") == 0.0
    )
    built = RankSummary.build(rank=0, status="error", breakdown=None)
    assert built.to_json()["breakdown"] is None and not built.measured  # the writer's nulls are written
