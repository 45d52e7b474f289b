"""fix's threads candidate: a launcher's per-rank share from distributed.threads, and for a single process
the count the profile found to fit from host.oversubscribed / host.contention; --apply's edit and the
override that makes a single process run at that count."""

from __future__ import annotations

import ast
import sys

import pytest
import torch

from pitstop.findings import Finding, Report, Severity
from pitstop.fix import core, verify
from pitstop.fix import dist as fix_dist
from pitstop.fix.apply import plan
from pitstop.fix.judge import Measured
from pitstop.patching import Patches
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.runs.runner import RunSpec, run
from pitstop.recipes.threads import inject as force_threads


def test_thread_split_candidate_gives_each_local_rank_its_share(monkeypatch):
    monkeypatch.setattr(fix_dist, "usable_cores", lambda: 8)
    f = Finding(id="distributed.threads", severity=Severity.WARN, title="t")
    kinds = core.kinds_from_findings([f])
    assert kinds == [("threads", "distributed.threads")]
    (c,) = core.build_candidates(kinds, {"local_world_size": 2}, core.FixConfig())[0]
    assert c.overrides.num_threads == 4 and c.name == "4 threads per rank"
    (one,) = core.build_candidates(kinds, {"local_world_size": 16}, core.FixConfig())[0]
    assert one.overrides.num_threads == 1 and one.name == "1 thread per rank"


def _oversubscribed(fit: int = 1) -> Finding:
    return Finding(
        id="host.oversubscribed", severity=Severity.WARN, title="t", data={"threads": 4, "fit": fit}
    )


def test_a_single_process_gets_the_fit_and_the_usable_cores(monkeypatch):
    monkeypatch.setattr(fix_dist, "usable_cores", lambda: 2)
    f = _oversubscribed(fit=1)
    kinds = core.kinds_from_findings([f])
    assert kinds == [("threads", "host.oversubscribed")]
    data = {"torch": {"num_threads": 4}}
    made, skipped = core.build_candidates(kinds, {}, core.FixConfig(), data, [f])
    assert not skipped
    assert [(c.name, c.overrides.num_threads, c.kind) for c in made] == [
        ("1 thread", 1, "threads"),
        ("2 threads", 2, "threads"),
    ]
    # no finding passed: the thread probe's fit; the count the script already runs is not a candidate
    probe = {"probes": {"threads": {"threads": 2, "fit": 1}}}
    (c,) = core.build_candidates([("threads", "host.contention")], {}, core.FixConfig(), probe)[0]
    assert c.name == "1 thread"
    made, skipped = core.build_candidates(
        [("threads", "requested")], {}, core.FixConfig(threads_values=(2,)), probe
    )
    assert not made and skipped == ["threads: the script already runs 2 intra-op threads"]


def test_verify_times_the_oversubscribed_warnings_own_count():
    report = Report("profile", findings=[_oversubscribed(fit=1)])
    f, kind = verify.top_warning(report)
    assert (f.id, kind) == ("host.oversubscribed", "threads")
    cfg = verify.fix_config(f, kind, 60.0)
    assert cfg.candidates == ("threads",) and cfg.threads_values == (1,)


def test_apply_writes_set_num_threads_into_a_plain_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text('"""A script with no main."""\nimport math\n\nx = math.pi\nprint(x)\n')
    r = core.FixResult(command=[sys.executable, str(script)], baseline=Measured("b", "baseline", {}))
    r.config = {"device": "cpu"}
    r.candidates.append(Measured("1 thread", "threads", {"num_threads": 1}))
    r.chosen.append("1 thread")
    p = plan(r)
    assert not p.unplaced, p.unplaced
    (patch,) = p.patches
    tree = ast.parse(patch.patched)
    lines = patch.patched.splitlines()
    assert "import torch" in lines
    at = next(i for i, ln in enumerate(lines) if ln.startswith("torch.set_num_threads(1)"))
    assert lines.index("import torch") < at < lines.index("x = math.pi")
    assert isinstance(tree.body[0], ast.Expr)  # the docstring stays first


def test_the_override_holds_against_the_scripts_own_count():
    before = torch.get_num_threads()
    patches = Patches()
    try:
        force_threads(patches, 1)
        torch.set_num_threads(2)
        assert torch.get_num_threads() == 1
    finally:
        patches.undo()
        torch.set_num_threads(before)
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(before)


@pytest.mark.slow
def test_a_single_process_run_keeps_the_overrides_thread_count(tmp_path):
    """What fix's child run does for a threads candidate: the script's own set_num_threads loses."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch import nn\ntorch.set_num_threads(2)\nmodel = nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor _ in range(20):\n"
        "    loss = model(torch.randn(8, 4)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    spec = RunSpec(
        command=[sys.executable, str(script)], steps=3, warmup=1, quiet=True, probes=False,
        overrides=Overrides(num_threads=1),
    )  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    assert res.ok, res.error
    assert res.data["torch"]["num_threads"] == 1
