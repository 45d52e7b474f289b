"""Host syncs sampled by step: past the first measured steps only one in ``SAMPLE_EVERY`` is timed; the
others get the sampled steps' means, and the sites are scaled to every measured step."""

from __future__ import annotations

import torch
from torch import nn

from pitstop.profile.analyze.rules import sync_rules
from pitstop.profile.capture import syncs
from pitstop.profile.capture.stepclock import FORWARD, PHASES, SYNC, PhaseClock
from pitstop.profile.capture.syncs import OTHER, SAMPLE_EVERY, SAMPLE_FIRST, SyncSites, make_sync
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
    for r in light:  # an estimate (the sampled steps' mean so far), moved out of the phases: parts add up
        assert 0.0 <= r["sync_s"] <= most
        assert all(r[p] >= 0.0 for p in PHASES)
        assert sum(r[p] for p in PHASES) <= r["total_s"] + 1e-9
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


def test_the_wrappers_come_off_on_steps_not_sampled_and_go_at_uninstall(instrument):
    def on() -> dict[str, object]:
        return {name: torch.Tensor.__dict__.get(name) for name in syncs.SYNC_METHODS}

    plain = on()
    inst = instrument(warmup=1)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    seen: list[tuple[bool, bool]] = []  # (step not sampled, Tensor's methods as without pitstop) per step
    for _ in range(1 + SAMPLE_FIRST + 2 * SAMPLE_EVERY):
        logits = model(x)
        seen.append((inst.syncs.light, on() == plain))
        bool(logits[0, 0] > 0)
        logits.sum().backward()
        opt.step()
        opt.zero_grad()
    assert any(light for light, _ in seen) and not all(light for light, _ in seen)
    assert all(light == bare for light, bare in seen)
    assert seen[-1][0]  # the run ends on a step not sampled: the wrappers are off
    inst.uninstall()
    assert on() == plain
    for _ in range(SAMPLE_EVERY):  # steps after uninstall put nothing back
        bool(model(x)[0, 0] > 0)
    assert on() == plain


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


def _rec(total: float, **phases: float) -> dict:
    return {**dict.fromkeys(PHASES, 0.0), **phases, "total_s": total, "warmup": False}


def test_unsampled_steps_move_the_sync_time_out_of_the_phase_it_ran_in(monkeypatch):
    """Fake clock: on sampled steps a .numpy() in forward takes 2 s and one after the model 1 s (.numpy(),
    as a device sync, is timed around each call); a step not sampled (its syncs untimed, left in forward
    and "other") gets them moved into sync_s, not added to it."""
    ticks = iter([])
    monkeypatch.setattr(syncs, "clock", lambda: next(ticks))
    ph = PhaseClock()
    st = SyncSites(ph)
    numpy = make_sync(st, "numpy", torch.Tensor.numpy)
    x = torch.ones(())
    for i in range(SAMPLE_FIRST):
        st.new_step(i)
        base = 100.0 * i
        ticks = iter([base + 1, base + 3, base + 5, base + 6])
        ph.split(base)
        ph.enter(FORWARD, base)
        numpy(x)  # 1 -> 3 in forward
        ph.exit(FORWARD, base + 4)
        numpy(x)  # 5 -> 6, no phase open
        rec = ph.split(base + 10)
        assert (rec[FORWARD], rec[SYNC]) == (2.0, 3.0)
        st.close_step(_rec(10.0, forward_s=rec[FORWARD], sync_s=rec[SYNC]))
    assert st.sampled_inside[FORWARD] == 2.0 * SAMPLE_FIRST and st.sampled_inside[OTHER] == SAMPLE_FIRST
    assert st.sampled_left[FORWARD] == [2.0] * SAMPLE_FIRST and st.sampled_left[OTHER] == [5.0] * SAMPLE_FIRST

    st.new_step(SAMPLE_FIRST + 1)
    assert st.light
    light = _rec(10.0, forward_s=4.0)  # the same step untimed: the syncs' 3 s in forward and "other"
    st.close_step(light)
    assert (light[FORWARD], light[SYNC], light["syncs"], light["sync_sampled"]) == (2.0, 3.0, 2, False)
    assert sum(light[p] for p in PHASES) == 5.0  # "other" 6 -> 5: the loop's second after the step

    st.new_step(SAMPLE_FIRST + 2)  # cheaper syncs: the phases keep their sampled time without syncs
    short = _rec(8.5, forward_s=3.0, backward_s=0.5)  # forward 2 + 1 of syncs, "other" 5
    st.close_step(short)
    assert (short[FORWARD], short[SYNC]) == (2.0, 1.0)
    assert sum(short[p] for p in PHASES) == 3.5


def test_sampling_thins_out_once_the_counts_have_settled():
    from pitstop.profile.capture.syncs import SAMPLE_EVERY_LATE, SAMPLE_LATE_FROM, is_light

    sampled = [i for i in range(-3, SAMPLE_LATE_FROM + 3 * SAMPLE_EVERY_LATE) if not is_light(i)]
    early = [i for i in sampled if i < SAMPLE_LATE_FROM]
    late = [i for i in sampled if i >= SAMPLE_LATE_FROM]
    assert early == [
        *range(-3, SAMPLE_FIRST),
        *range(-(-SAMPLE_FIRST // SAMPLE_EVERY) * SAMPLE_EVERY, SAMPLE_LATE_FROM, SAMPLE_EVERY),
    ]
    assert late == list(range(SAMPLE_LATE_FROM, SAMPLE_LATE_FROM + 3 * SAMPLE_EVERY_LATE, SAMPLE_EVERY_LATE))
