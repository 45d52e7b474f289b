"""fix on launcher commands: the DDP candidates, their injection into a rank, and the job's step times."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pitstop.findings import Finding, Severity
from pitstop.profile.ddp_inject import DDPInjection
from pitstop.profile.overrides import Overrides
from pitstop.profile.ranks import RanksResult
from pitstop.profile.runner import RunResult
from pitstop.profile.timeline import StepRecord
from pitstop.tune import fix, fix_dist

ORIG_FORWARD = nn.parallel.DistributedDataParallel.forward
DDP_FACTS = [{"location": "train.py:48", "find_unused_parameters": True, "static_graph": False}]


def dist_config(**kw):
    return {"local_world_size": 2, "distributed": {"ddp": DDP_FACTS, "forwards_per_step": 4.0,
                                                   "rounds_per_step": 4.0, "graph_static": True, **kw}}  # fmt: skip


def test_profile_findings_pick_no_sync_and_static_graph_from_the_registry():
    found = [
        Finding(id=i, severity=Severity.WARN, title="t")
        for i in ("ddp.no_sync", "ddp.find_unused_parameters")
    ]
    kinds = fix.kinds_from_findings(found)
    assert kinds == [("no_sync", "ddp.no_sync"), ("static_graph", "ddp.find_unused_parameters")]
    cands, skipped = fix.build_candidates(kinds, dist_config(), fix.FixConfig())
    assert [c.overrides for c in cands] == [Overrides(ddp_no_sync=4), Overrides(ddp_static_graph=True)]
    assert skipped == []
    code, at = fix_dist.snippet("no_sync", cands[0].overrides.to_dict(), dist_config())
    assert "% 4 else" in code and at == "train.py:48"


@pytest.mark.parametrize(
    ("kind", "config", "why"),
    [
        ("static_graph", dist_config(graph_static=False), "would be invalid"),
        ("static_graph", dist_config(ddp=[{**DDP_FACTS[0], "static_graph": True}]), "already has"),
        ("no_sync", dist_config(forwards_per_step=1.0, rounds_per_step=1.0), "one gradient all-reduce"),
        ("no_sync", {"local_world_size": 1}, "no DistributedDataParallel"),
    ],
)
def test_ddp_candidates_are_skipped_where_they_cannot_apply(kind, config, why):
    cands, skipped = fix.build_candidates([(kind, "requested")], config, fix.FixConfig())
    assert cands == [] and len(skipped) == 1 and why in skipped[0]


def _steps(times):
    return [StepRecord(index=i, start_s=0.0, total_s=t) for i, t in enumerate(times)]


def test_a_launch_is_judged_on_its_slowest_rank_with_every_ranks_override_errors():
    def rank(times, errors=()):
        return RunResult(
            0, None, _steps(times), [1.0] * len(times), {"override_errors": list(errors)}, None, 1.0
        )

    r0, r1 = rank([0.1, 0.1]), rank([0.3, 0.2], ["ddp_no_sync: no DDP forward ran without gradient sync"])
    res = RanksResult(0, None, r0.steps, r0.losses, {"override_errors": []}, None, 1.0, ranks={0: r0, 1: r1})
    view = fix_dist.job_view(res)
    assert [s.total_s for s in view.steps] == [0.3, 0.2] and view.losses == r0.losses
    assert view.config["judged_rank"] == 1
    assert view.config["override_errors"] == ["rank 1: ddp_no_sync: no DDP forward ran without gradient sync"]
    assert res.steps is r0.steps  # the launch's own result is unchanged
    single = RunResult(0, None, _steps([0.1]), [1.0], {}, None, 1.0)
    assert fix_dist.job_view(single) is single


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.unused = nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        return self.a(x).tanh().sum(1)


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(ov: Overrides, accum_pattern: list[int]):
    """Steps of accumulation (micro-batches per step from ``accum_pattern``) under ``ov``; the weights."""
    inj = DDPInjection(ov)
    inj.install()
    try:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        for micro in accum_pattern:
            for _ in range(micro):
                model(torch.randn(4, 6, generator=g)).mean().backward()
            opt.step()
            opt.zero_grad()
    finally:
        inj.uninstall()
    return copy.deepcopy(model.module.state_dict()), inj


def test_no_sync_injection_keeps_the_gradients_and_fixes_up_an_uneven_step(group):
    pattern = [4, 4, 4, 3, 4]  # the fourth step has one micro-batch fewer than k: its gradient is fixed up
    want, _ = _train(Overrides(), pattern)
    got, inj = _train(Overrides(ddp_no_sync=4), pattern)
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    facts = inj.facts()
    assert facts["unsynced_forwards"] == 3 + 3 + 3 + 3  # every micro-batch but each 4th, after step 1
    assert facts["fixup_steps"] == 1 and inj.not_applied() == []
    assert nn.parallel.DistributedDataParallel.forward is ORIG_FORWARD  # nothing stays patched


def test_static_graph_injection_and_what_did_not_apply(group):
    want, _ = _train(Overrides(), [1, 1, 1])
    got, inj = _train(Overrides(ddp_static_graph=True), [1, 1, 1])
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    assert inj.facts()["static_graph_models"] == 1 and inj.not_applied() == []
    _, idle = _train(Overrides(ddp_no_sync=4), [1])
    assert idle.not_applied() == [
        "ddp_no_sync: no DDP forward ran without gradient sync (no accumulation seen)"
    ]
    _, uneven = _train(Overrides(ddp_no_sync=4), [1, 1, 1])
    assert uneven.facts()["fixup_steps"] == 2 and "no step had 4 micro-batches" in uneven.not_applied()[0]
