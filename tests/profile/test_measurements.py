"""The typed measurements record (``record.measurements``) and the rule registry (``analyze.registry``)."""

from __future__ import annotations

import json

import pytest

from pitstop.findings import Finding, Severity
from pitstop.profile.analyze import registry
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.record.measurements import SCHEMA, LoaderRecord, Measurements, NewerRecord
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.result import RunSpec, read_measurements

RECORD = {
    "version": 1,
    "schema": SCHEMA,
    "status": "completed",
    "warmup": 2,
    "steps": [{"warmup": True, "total_s": 0.1}],
    "step_boundary": "optimizer.step()",
    "totals": {"batches": 3},
    "sync_sites": [{"location": "t.py:3", "method": "item", "measured_count": 4, "time_s": 0.01}],
    "loaders": [
        {"location": "t.py:1", "num_workers": 2, "pin_memory": False, "batches_seen": 9, "prefetch_factor": 2}
    ],
    "models": [{"type": "Net", "device": "cpu", "params": 10, "first_location": "t.py:2"}],
    "optimizers": [{"type": "SGD"}],
    "device": "cpu",
    "torch": {"num_threads": 2},
    "memory": {"peak_rss_bytes": 1},
    "gpu_util": None,
    "probes": {"precision": {"skipped": "no bf16"}},
    "a_newer_key": {"kept": True},
}


def test_round_trip_keeps_every_key():
    m = Measurements.from_json(RECORD)
    assert m.loaders[0].num_workers == 2 and m.loaders[0].extra == {"prefetch_factor": 2}
    assert m.sync_sites[0].measured_count == 4 and m.model.first_location == "t.py:2"
    assert m.extra == {"a_newer_key": {"kept": True}}
    # None-valued fields are left out; every other key comes back as it was
    assert m.to_json() == {k: v for k, v in RECORD.items() if v is not None}
    assert Measurements.from_json(m.to_json()) == m
    assert Measurements.from_json(json.loads(json.dumps(m.to_json()))) == m


def test_missing_keys_take_defaults_and_stay_missing():
    m = Measurements.from_json({"status": "killed"})
    assert m.loaders == () and m.probe_results == {} and m.dev_type == "cpu"
    assert m.to_json() == {"status": "killed"}
    assert LoaderRecord.from_json({}).workers == 0


def test_older_record_without_schema_is_read():
    old = {k: v for k, v in RECORD.items() if k != "schema"}
    assert Measurements.from_json(old).schema is None


def test_newer_schema_is_refused_with_a_message(tmp_path):
    with pytest.raises(NewerRecord, match="newer than this pitstop reads"):
        Measurements.from_json({**RECORD, "schema": SCHEMA + 1})
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps({**RECORD, "schema": SCHEMA + 1}))
    result = read_measurements(RunSpec(command=["x"]), path, 0, None, 1.0)
    assert result.status == "error" and "newer than this pitstop reads" in (result.error or "")
    assert result.report().error  # the report says why, no traceback


def test_registered_rules_run_in_declared_order():
    rules = registry.registered()
    assert [r.order for r in rules] == sorted(r.order for r in rules)
    names = [r.name.rsplit(".", 1)[1] for r in rules]
    # the order the rules were chained in by hand: progress first, the setup facts last
    assert names.index("progress_rule") < names.index("dataloader_rule") < names.index("sync_rule")
    assert names.index("contention_rule") < names.index("probe_failure_rule") < names.index("setup_rule")


def _steps(n: int = 10) -> list[StepRecord]:
    return [StepRecord(index=i, start_s=0.1 * i, total_s=0.1, forward_s=0.05) for i in range(n)]


def test_a_new_rule_registers_itself():
    @registry.rule(order=5, name="test.custom")
    def custom(v: registry.RunView) -> list[Finding]:
        workers = v.m.loaders[0].num_workers if v.m.loaders else None
        return [Finding(id="test.custom", severity=Severity.INFO, title=f"workers {workers}", evidence="")]

    try:
        found, _ = findings_for(_steps(), {"loaders": [{"num_workers": 3}]}, cores=2)
        assert [f.title for f in found if f.id == "test.custom"] == ["workers 3"]
        assert "test.custom" in [r.name for r in registry.registered()]
    finally:
        registry.unregister("test.custom")
    assert not any(f.id == "test.custom" for f in findings_for(_steps(), {}, cores=2)[0])
