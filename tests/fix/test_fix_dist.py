"""fix on launcher commands: the DDP candidates, their injection into a rank, and the job's step times."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pitstop.findings import Finding, Severity
from pitstop.fix import core
from pitstop.fix import dist as fix_dist
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.ranks import RanksResult
from pitstop.profile.runs.runner import RunResult
from pitstop.recipes.step import DDPInjection

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
    kinds = core.kinds_from_findings(found)
    assert kinds == [("no_sync", "ddp.no_sync"), ("static_graph", "ddp.find_unused_parameters")]
    cands, skipped = core.build_candidates(kinds, dist_config(), core.FixConfig())
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
    cands, skipped = core.build_candidates([(kind, "requested")], config, core.FixConfig())
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
    inj = DDPInjection(ov.ddp_no_sync, ov.ddp_static_graph)
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


@pytest.mark.slow
def test_fix_on_a_torchrun_command_measures_the_ddp_candidates_on_the_whole_job(tmp_path):
    """`pitstop fix -- torchrun --nproc_per_node=2 examples/ddp_accum.py`, each run the whole launch."""
    import socket
    import sys

    from pitstop.fix.judge import SPEED_VERDICTS
    from pitstop.fix.runs import run_fix
    from pitstop.profile.runs.merge import ddp_facts
    from pitstop.profile.runs.runner import run

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    example = Path(__file__).resolve().parents[2] / "examples" / "ddp_accum.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={port}", str(example), "--width", "256"]  # fmt: skip
    runs: list = []

    def runner(spec):
        runs.append(run(spec))
        return runs[-1]

    cfg = core.FixConfig(
        steps=4, warmup=2, budget=240, min_rounds=1, max_rounds=1, timeout=120, cwd=str(tmp_path)
    )
    cfg.candidates = ("no_sync", "static_graph", "threads")
    cfg.env = {"MASTER_ADDR": "127.0.0.1"}
    result = run_fix(cmd, cfg, runner=runner)
    assert result.baseline_error is None, result.baseline_error
    by_kind = {m.kind: m for m in result.candidates}
    assert set(by_kind) == {"no_sync", "static_graph", "threads"}
    assert by_kind["no_sync"].overrides["ddp_no_sync"] == 4  # the example's accumulation, from the baseline
    base_loss = result.baseline.loss_means[0]
    for m in by_kind.values():
        assert m.verdict in SPEED_VERDICTS, (m.name, m.verdict, m.errors, m.skipped)
        assert m.steps_per_s and m.loss_means[0] == pytest.approx(base_loss, rel=1e-4)  # same computation
    injected = next(r for r in runs if r.spec.overrides.ddp_no_sync)
    for res in injected.ranks.values():  # every rank skipped the sync of 3 of its 4 micro-batches
        facts = res.data["distributed"]["injected"]
        assert facts["unsynced_forwards"] > 0 and facts["fixup_steps"] == 0
    assert ddp_facts(injected.ranks)["rounds_per_step"] == 1.0
    assert ddp_facts(runs[0].ranks)["rounds_per_step"] == 4.0


def test_rank_zero_probes_a_copy_outside_ddp_and_no_collective_gets_through(group):
    from pitstop.profile.rank.comm import CommRecorder
    from pitstop.profile.rank.rank_worker import RankWorker, identity

    worker = RankWorker(identity({}), Path("."))
    worker.comm = CommRecorder()
    worker.comm.install()
    try:
        ddp = nn.parallel.DistributedDataParallel(Net())
        model, why = worker.probe_model(ddp)
        assert why is None and type(model) is Net and model is not ddp.module
        with pytest.raises(RuntimeError, match="refused, no peer takes part"):
            dist.all_reduce(torch.ones(1))
    finally:
        worker.comm.uninstall()


def test_the_report_says_where_probes_ran():
    from pitstop.profile.analyze.dist_rules import probes_on_ranks

    f = probes_on_ranks({0: {"pass_s": 0.1}, 1: None, 2: None})
    assert f.id == "profile.probes_ranks" and "probes skipped on ranks 1, 2" in f.evidence
    fsdp = probes_on_ranks({0: {"skipped": ["model: FSDP shards the parameters"]}, 1: None})
    assert "optimizers only (FSDP shards the parameters)" in fsdp.evidence
    assert probes_on_ranks({0: {"pass_s": 0.1}}) is None
