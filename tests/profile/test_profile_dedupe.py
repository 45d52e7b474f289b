"""One finding per site: optimizers built at one line, an optimizer initialised twice, and the final
assembly's (id, location) merge."""

from __future__ import annotations

import torch
from torch import nn

from pitstop.findings import Finding, Severity, dedupe
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.record.timeline import StepRecord

torch.set_num_threads(1)


def steps(n=10, total=0.1, **parts) -> list[StepRecord]:
    return [StepRecord(index=i, start_s=i * total, total_s=total, **parts) for i in range(n)]


def _adam(where: str, saving: float) -> tuple[dict, dict]:
    facts = {"type": "Adam", "impl": "for-loop", "params": 4, "location": where}
    probe = {"type": "Adam", "location": where, "base_s": 0.01, "new_s": 0.01 - saving, "saving_s": saving}
    return facts, probe


def test_two_optimizers_of_one_type_built_at_one_line_give_one_finding():
    (a, pa), (b, pb) = _adam("gan.py:20", 0.004), _adam("gan.py:20", 0.002)
    (c, pc) = _adam("gan.py:31", 0.003)
    data = {"optimizers": [a, b, c], "probes": {"optimizer": [pa, pb, pc]}}
    found, _ = findings_for(steps(optimizer_s=0.02), data, cores=2)
    foreach = [f for f in found if f.id == "optimizer.foreach"]
    assert sorted(f.location for f in foreach) == ["gan.py:20", "gan.py:31"]
    site = next(f for f in foreach if f.location == "gan.py:20")
    # both optimizers' measured savings, each stepping once a step
    assert abs(site.est_saving_s - 0.006) < 1e-12 and len(site.data["optimizers"]) == 2
    assert "2 Adam optimizers built here" in site.evidence
    other = next(f for f in foreach if f.location == "gan.py:31")
    assert abs(other.est_saving_s - 0.003) < 1e-12  # its own probe, not the other site's


def test_an_optimizer_initialised_twice_is_one_optimizer(instrument):
    class Reinit(torch.optim.SGD):
        def __init__(self, params, lr):
            params = list(params)
            super().__init__(params, lr=lr)
            super().__init__(params, lr=lr)  # as some wrappers do

    inst = instrument()
    Reinit(nn.Linear(2, 2).parameters(), lr=0.1)
    assert len(inst.captured.optimizers) == 1 and len(inst.optimizer_facts) == 1


def test_dedupe_keeps_the_worst_per_id_and_location_and_merges_data():
    a = Finding("x.y", Severity.INFO, "a", data={"n": 1}, location="t.py:1", est_saving_s=0.1)
    b = Finding("x.y", Severity.WARN, "b", data={"n": 2}, location="t.py:1", est_saving_s=0.05)
    c = Finding("x.y", Severity.INFO, "c", data={"n": 1}, location="t.py:1")
    d = Finding("x.y", Severity.INFO, "d", location="t.py:2")
    e, e2 = Finding("z", Severity.PASS, "e"), Finding("z", Severity.PASS, "e2")
    out = dedupe([a, d, b, e, c, e2])
    assert [f.title for f in out] == ["b", "d", "e", "e2"]  # the worst in the first one's place
    assert out[0].data == {"n": 2, "merged": [{"n": 1}]}  # identical data merged once
