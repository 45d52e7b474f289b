"""Host syncs sampled by step: past the first measured steps only one in ``SAMPLE_EVERY`` is timed; the
others get the sampled steps' means, and the sites are scaled to every measured step."""

from __future__ import annotations

import torch
from torch import nn

from pitstop.profile.analyze.rules import sync_rules
from pitstop.profile.capture.stepclock import PhaseClock
from pitstop.profile.capture.syncs import SAMPLE_EVERY, SAMPLE_FIRST, SyncSites
from pitstop.profile.record.timeline import StepRecord, breakdown

torch.set_num_threads(1)


def _loop(steps: int, per_step: int) -> None:
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    for _ in range(steps):
        logits = model(x)
        nn.functional.cross_entropy(logits, y).backward()
        opt.step()
        opt.zero_grad()
        preds = logits.detach().argmax(1)
        for i in range(per_step):
            bool(preds[i] == y[i])  # a per-element loop of syncs


def test_syncs_are_timed_on_sampled_steps_and_scaled_to_all(instrument):
    warmup, measured, per_step = 2, SAMPLE_FIRST + 3 * SAMPLE_EVERY, 6
    inst = instrument(warmup=warmup)
    _loop(warmup + measured + 1, per_step)
    inst.close_pending()
    recs = inst.records[warmup : warmup + measured]
    sampled = [r for r in recs if r.get("sync_sampled", True)]
    light = [r for r in recs if not r.get("sync_sampled", True)]
    assert len(sampled) == SAMPLE_FIRST + 3 and len(light) == measured - len(sampled)
    assert all(r["syncs"] == per_step for r in inst.records)  # counted or estimated, the same here
    most = max(r["sync_s"] for r in sampled)
    for r in light:  # an estimate (the sampled steps' mean so far), never more than the time no phase covered
        assert 0.0 <= r["sync_s"] <= most
        assert sum(
            r[p] for p in ("data_wait_s", "h2d_s", "forward_s", "backward_s", "optimizer_s", "sync_s")
        ) <= (r["total_s"] + 1e-9)
    (row,) = inst.sync_site_rows()
    n_measured = inst.syncs.steps_measured
    assert row["measured_steps"] == n_measured and row["sampled_steps"] == inst.syncs.steps_sampled
    assert abs(row["measured_count"] - per_step * n_measured) < 1e-6
    assert row["count"] == per_step * (warmup + n_measured)
    steps = [StepRecord.from_dict(r) for r in inst.records if not r["warmup"]]
    (finding,) = sync_rules(breakdown(steps), [row], "cpu", len(steps))
    assert "timed on" in finding.evidence and f"x{per_step}/step" in finding.evidence


def test_the_warmup_and_first_measured_steps_are_all_timed(instrument):
    inst = instrument(warmup=3)
    _loop(3 + SAMPLE_FIRST, 4)
    inst.close_pending()
    assert all(r.get("sync_sampled", True) and r["syncs"] == 4 for r in inst.records)
    (row,) = inst.sync_site_rows()
    assert "sampled_steps" not in row


def test_cuda_sync_debug_mode_is_off_on_steps_not_sampled(monkeypatch):
    modes: list[object] = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    st = SyncSites(PhaseClock())
    st.cuda_debug = True
    sampled_next = (SAMPLE_FIRST // SAMPLE_EVERY + 1) * SAMPLE_EVERY  # the first sampled step after them
    for i in range(-2, sampled_next + 1):
        st.new_step(i)
    # on through the warm-up and the first measured steps, off after them, on for the next sampled step
    assert modes == [0, "warn"]
    assert not st.light
