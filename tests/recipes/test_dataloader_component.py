"""The DataLoader components (``pitstop.recipes.dataloader``: num_workers, persistent_workers,
pin_memory): their injection into a loader's keywords, what profile records of a built loader, their rules
on a synthetic breakdown, fix's candidates and the ``fix --apply`` edit of a ``DataLoader(...)`` call."""

from __future__ import annotations

import torch

from pitstop.findings import Severity
from pitstop.fix.patch import keyword_edit, loader_keywords
from pitstop.profile.analyze import rulekit
from pitstop.profile.analyze.rules import dataloader_rules
from pitstop.profile.record.timeline import Breakdown
from pitstop.recipes import component, loader_components, recipe
from pitstop.recipes.component import LOADER
from pitstop.recipes.dataloader import (
    PERSISTENT_WORKERS,
    PIN_MEMORY,
    SETTINGS,
    SLOW,
    WORKERS,
    LoaderRun,
    inject,
)
from pitstop.recipes.knobs import Knobs
from pitstop.recipes.workers import WorkerMachine


def test_the_registry_entries_name_the_three_components():
    assert loader_components() == list(SETTINGS)
    for comp in SETTINGS:
        r = recipe(comp.NAME)
        assert component(comp.NAME) is comp and comp.SURFACE == LOADER
        assert r.override == comp.KNOB == f"dataloader.{comp.KEY}" and r.snippet == comp.SNIPPET
        assert Knobs.setting(comp.KNOB, 2).dataloader == {comp.KEY: 2}


def test_apply_loader_kwargs_forces_its_keyword_and_skips_what_needs_workers():
    kw, applied, skipped = WORKERS.apply_loader_kwargs({"num_workers": 0}, {"num_workers": 4})
    assert kw == {"num_workers": 4} and applied == {"num_workers": 4} and skipped == {}
    kw, applied, skipped = PERSISTENT_WORKERS.apply_loader_kwargs({}, {"persistent_workers": True})
    assert kw == {} and applied == {} and skipped == {"persistent_workers": "needs num_workers > 0"}
    kw, applied, _ = PIN_MEMORY.apply_loader_kwargs({"batch_size": 8}, {"num_workers": 2})
    assert kw == {"batch_size": 8} and applied == {}  # not its keyword: as it was


def test_inject_applies_every_component_in_order():
    kw = {"batch_size": 8}
    applied, skipped = inject(kw, {"num_workers": 2, "persistent_workers": True, "pin_memory": True})
    assert applied == {"num_workers": 2, "persistent_workers": True, "pin_memory": True} and skipped == {}
    assert kw == {"batch_size": 8, "num_workers": 2, "persistent_workers": True, "pin_memory": True}
    kw = {"num_workers": 0}
    applied, skipped = inject(kw, {"persistent_workers": True, "prefetch_factor": 4})
    assert applied == {} and set(skipped) == {"persistent_workers", "prefetch_factor"}
    assert kw["persistent_workers"] is False and kw["prefetch_factor"] is None


def test_facts_read_a_built_loader():
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    loader = torch.utils.data.DataLoader(ds, batch_size=2, pin_memory=False)
    facts = {k: v for c in loader_components() for k, v in c.facts(loader).items()}
    assert facts == {"num_workers": 0, "persistent_workers": False, "pin_memory": False}


def _bd(data_wait: float = 0.0, h2d: float = 0.0, total: float = 0.1) -> Breakdown:
    parts = {"data_wait_s": data_wait, "h2d_s": h2d, "forward_s": total - data_wait - h2d}
    return Breakdown(n=20, total_s=total, median_total_s=total, parts=parts, syncs_per_step=0.0)


def _run(bd: Breakdown, loader: dict, cores: int = 8, device: str = "cpu") -> LoaderRun:
    return LoaderRun(bd, [loader], loader, cores, device, {})


def test_workers_rule_suggests_workers_then_calls_the_pipeline_slow():
    loader = {"num_workers": 0, "batches_seen": 20, "wait_s": 1.0, "location": "train.py:9"}
    (f,) = WORKERS.rules(_run(_bd(data_wait=0.05), loader, cores=8), rulekit)
    assert f.id == WORKERS.FINDING and f.severity is Severity.WARN and f.location == "train.py:9"
    assert f.data["suggested_workers"] >= 1 and "num_workers=" in f.fix_code
    assert WORKERS.rules(_run(_bd(data_wait=0.001), loader), rulekit) == []  # under WARN_SHARE
    busy = {**loader, "num_workers": 64}
    (slow,) = WORKERS.rules(_run(_bd(data_wait=0.05), busy), rulekit)
    assert slow.id == SLOW


def test_pin_memory_rule_on_cuda_only():
    loader = {"num_workers": 2, "pin_memory": False, "batches_seen": 20, "wait_s": 0.0}
    (f,) = PIN_MEMORY.rules(_run(_bd(h2d=0.02), loader, device="cuda:0"), rulekit)
    assert f.id == PIN_MEMORY.FINDING and f.est_saving_s == 0.02 and f.fix_code == PIN_MEMORY.SNIPPET
    assert PIN_MEMORY.rules(_run(_bd(h2d=0.02), loader, device="cpu"), rulekit) == []
    pinned = {**loader, "pin_memory": True}
    assert PIN_MEMORY.rules(_run(_bd(h2d=0.02), pinned, device="cuda"), rulekit) == []


def test_persistent_workers_rule_spreads_the_restart_over_an_epoch():
    loader = {
        "num_workers": 2,
        "persistent_workers": False,
        "batches_seen": 20,
        "batches_per_epoch": 10,
        "wait_s": 0.02,
        "first_batch_s": [0.5, 0.5],
        "iterators": 2,
    }
    (f,) = PERSISTENT_WORKERS.rules(_run(_bd(), loader), rulekit)
    assert f.id == PERSISTENT_WORKERS.FINDING and abs(f.est_saving_s - (0.5 - 0.001) / 10) < 1e-9
    kept = {**loader, "persistent_workers": True}
    assert PERSISTENT_WORKERS.rules(_run(_bd(), kept), rulekit) == []


def test_dataloader_rules_calls_every_component():
    loader = {"num_workers": 2, "pin_memory": False, "batches_seen": 20, "wait_s": 1.0, "first_batch_s": []}
    found = dataloader_rules(_bd(data_wait=0.05, h2d=0.02), [loader], 8, "cuda", {})
    assert {f.id for f in found} >= {PIN_MEMORY.FINDING} and any(
        f.id in (WORKERS.FINDING, SLOW) for f in found
    )
    assert dataloader_rules(_bd(), [{**loader, "batches_seen": 0}], 8, "cuda") == []


def test_candidates_for_fix():
    m = WorkerMachine(cores=8, torch_max=8)
    made = WORKERS.candidates({"num_workers": 0}, m, None)
    assert made and all(kw["persistent_workers"] is True and kw["num_workers"] > 0 for _, kw in made)
    assert WORKERS.candidates({"num_workers": 2}, m, (2, 4)) == [
        ("num_workers=4", {"num_workers": 4, "persistent_workers": True})
    ]
    assert isinstance(WORKERS.candidates({}, m, None), str)  # no loader
    assert PERSISTENT_WORKERS.candidates({"num_workers": 2}, m, None) == [
        ("persistent_workers", {"persistent_workers": True})
    ]
    assert isinstance(PERSISTENT_WORKERS.candidates({"num_workers": 0}, m, None), str)
    assert isinstance(PIN_MEMORY.candidates({"pin_memory": True}, m, None), str)


class _Editor:
    def __init__(self, setting):
        self.setting, self.values = setting, {}

    def keywords(self, values):
        self.values.update(values)


def test_edit_writes_its_keyword_on_the_dataloader_call():
    ed = _Editor(4)
    assert WORKERS.edit(ed) == {"num_workers": 4} and ed.values == {"num_workers": 4}
    forced = {"num_workers": 4, "persistent_workers": True, "prefetch_factor": 2}
    assert loader_keywords(forced) == forced  # in order; the tuner's keyword as it is
    text = "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=8, num_workers=0)\n"
    patched = keyword_edit(text, 2, loader_keywords(forced))
    assert (
        "DataLoader(ds, batch_size=8, num_workers=4, persistent_workers=True, prefetch_factor=2)" in patched
    )
