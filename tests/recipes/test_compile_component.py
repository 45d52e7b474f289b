"""The torch.compile component (``pitstop.recipes.compile``): its wrapper with the eager fallback (train,
bench), the 'auto' rule, profile's injection and facts, its info finding, fix's candidate and its
``fix --apply`` edit on a small script. ``torch.compile`` is faked throughout: compiling takes seconds."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from pitstop.findings import Finding, Severity
from pitstop.fix.apply import FileEdits, ModelEditor
from pitstop.fix.core import FixConfig, build_candidates, kinds_from_findings
from pitstop.profile.analyze.rulekit import PHASE_OF
from pitstop.profile.record.overrides import Overrides
from pitstop.recipes import compile as torch_compile
from pitstop.recipes import component, components, recipe
from pitstop.recipes.compile_fallback import CompiledWithFallback
from pitstop.recipes.component import WRAP
from pitstop.recipes.knobs import Knobs


class DynamoError(RuntimeError):
    """An error as dynamo raises it (its module marks it as a compile error)."""


DynamoError.__module__ = "torch._dynamo.exc"


@pytest.fixture
def fake_compile(monkeypatch):
    """``torch.compile`` as a fake: the model itself, or (``broken``) a callable raising dynamo's error."""
    state = SimpleNamespace(broken=False, calls=[])

    def compile_(model, **kwargs):
        state.calls.append(kwargs)
        if not state.broken:
            return model

        def fails(*args, **kw):
            raise DynamoError("backend failed")

        return fails

    monkeypatch.setattr(torch, "compile", compile_)
    return state


def test_the_registry_entry_takes_its_names_from_the_module():
    r = recipe("compile")
    assert component("compile") is torch_compile and components(WRAP) == [torch_compile]
    got = (r.title, r.snippet, r.finding, r.probe, r.override)
    assert got == ("torch.compile", "model.compile()", "compile.none", None, "compile")
    assert r.train == "TrainConfig.compile" and r.apply == "pitstop.fix.apply.apply_component"
    assert r.untimed and r.bench == (("compile", "torch.compile"),) and r.site == "model"
    assert Overrides.setting(r.override, True) == Overrides(compile=True) and not Knobs().compile
    assert PHASE_OF["compile.none"] == ("forward_s", "backward_s")


def test_wrap_runs_the_compiled_model_and_falls_back_to_eager(fake_compile):
    model = nn.Linear(2, 2)
    x = torch.randn(3, 2)
    wrapped = torch_compile.wrap(model, mode="default")
    assert isinstance(wrapped, CompiledWithFallback) and fake_compile.calls == [{"mode": "default"}]
    assert torch.equal(wrapped(x), model(x)) and torch_compile.failed(wrapped) is None
    fake_compile.broken = True
    wrapped = torch_compile.wrap(model)
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*training continues eagerly"):
        out = wrapped(x)
    assert torch.equal(out, model(x)) and isinstance(torch_compile.failed(wrapped), DynamoError)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped(x)  # warned once; eager from then on
    assert torch_compile.failed(model) is None  # a model wrap left as it was


def test_wrap_leaves_the_model_where_torch_cannot_compile_it(monkeypatch):
    model = nn.Linear(2, 2)

    def no_backend(m, **kw):
        raise RuntimeError("unknown backend")

    monkeypatch.setattr(torch, "compile", no_backend)
    with pytest.warns(RuntimeWarning, match="torch.compile unavailable"):
        assert torch_compile.wrap(model) is model
    monkeypatch.delattr(torch, "compile")
    with pytest.warns(RuntimeWarning, match="not available in this torch"):
        assert torch_compile.wrap(model) is model


def test_a_model_error_is_no_compile_error(fake_compile):
    from pitstop.recipes.compile_fallback import is_compile_error

    assert is_compile_error(DynamoError("x")) and is_compile_error(OSError("no cc"))
    assert not is_compile_error(ValueError("shapes"))
    wrapped = torch_compile.wrap(nn.Linear(2, 2))
    with pytest.raises(RuntimeError):
        wrapped(torch.randn(3, 5))  # the model's own error propagates
    assert torch_compile.failed(wrapped) is None


def test_inner_and_train_unwrap(fake_compile):
    from pitstop.train import maybe_compile, unwrap

    model = nn.Linear(2, 2)
    assert torch_compile.inner(model) is None
    assert torch_compile.inner(torch_compile.wrap(model)) is model
    assert torch_compile.inner(SimpleNamespace(_orig_mod=model)) is model  # torch.compile's OptimizedModule
    assert torch_compile.inner(SimpleNamespace(_orig_mod="not a module")) is None
    assert unwrap(maybe_compile(model)) is model and maybe_compile(model, enabled=False) is model


def test_the_auto_rule_is_the_components_and_train_uses_it(monkeypatch):
    from pitstop.train import compile_auto

    monkeypatch.setitem(torch_compile.SAVING, "cpu", 0.05)  # a stated CPU saving (the measured one is none)
    assert compile_auto.rule is torch_compile.pays and compile_auto.SAVING is torch_compile.SAVING
    step_s = 0.022
    even = torch_compile.break_even_steps(step_s, "cpu")
    assert 50_000 < even < 60_000 and torch_compile.pays(even, step_s, "cpu")[0]
    on, why = torch_compile.pays(even - 2, step_s, "cpu")
    assert not on and why.startswith("off: ") and why.endswith("<= 60 s compilation")
    assert torch_compile.pays(even, step_s, "mps") == torch_compile.pays(even, step_s, "cpu")


def test_inject_compiles_in_place_or_says_why_not(fake_compile):
    model = nn.Linear(2, 2)
    assert not torch_compile.model_facts(model)["compiled"]
    assert torch_compile.inject(model) is None and torch_compile.model_facts(model) == {"compiled": True}
    assert torch_compile.model_facts(SimpleNamespace(_orig_mod=model)) == {"compiled": True}

    class Stubborn(nn.Linear):
        def compile(self, *args, **kwargs):
            raise TypeError("no")

    assert torch_compile.inject(Stubborn(2, 2)) == "TypeError: no"


def test_install_lets_dynamo_fall_back_to_eager_until_uninstalled():
    import torch._dynamo as dynamo

    from pitstop.patching import Patches

    with dynamo.config.patch(suppress_errors=False):  # restored after (monkeypatch's undo hides it)
        patches = Patches()
        torch_compile.install(patches)
        assert dynamo.config.suppress_errors is True
        patches.undo()  # the instrumentation's uninstall: the user's own compile errors raise again
        assert dynamo.config.suppress_errors is False


def test_profile_injects_it_into_each_model_found(monkeypatch):
    from pitstop.profile.capture.models import ModelHooks

    seen, installed = [], []
    monkeypatch.setattr(torch_compile, "inject", lambda m: seen.append(m) or "TypeError: no")
    monkeypatch.setattr(torch_compile, "install", lambda p: installed.append(True))
    for ov, want in ((Overrides(compile=True), True), (Overrides(), False)):
        seen.clear()
        inst = SimpleNamespace(
            cfg=SimpleNamespace(overrides=ov),
            captured=SimpleNamespace(models=[]),
            model_facts={},
            compile_error=None,
        )
        hooks = ModelHooks(inst)
        hooks.install(SimpleNamespace(patch=lambda *a: None))
        hooks.uninstall()
        model = nn.Linear(2, 2)
        hooks.add_model(model)
        assert (seen == [model], inst.compile_error == "TypeError: no") == (want, want)
    assert installed == [True]


def test_profile_facts_record_it_where_they_did():
    from pitstop.profile.capture.facts import model_facts

    facts = model_facts(nn.Linear(2, 2))
    keys = list(facts)
    assert facts["compiled"] is False and keys.index("compiled") == keys.index("dataparallel") - 1


MODEL = {"param_dtypes": ["float32"], "first_location": "train.py:12"}


def test_the_rule_says_where_it_was_not_used():
    from pitstop.profile.analyze.rules_compute import setup_rules

    (f,) = torch_compile.findings(MODEL, {})
    assert (f.id, f.severity, f.title, f.location) == (
        "compile.none",
        Severity.INFO,
        "The model is not compiled",
        "train.py:12",
    )
    assert f.evidence == (
        "torch.compile was not used; its gain depends on the model and is not measured by a profile run "
        "(compiling takes minutes). `pitstop fix` measures it."
    )
    assert f.fix == "Try torch.compile; keep it if `pitstop fix` shows a gain."
    assert f.fix_code == "model.compile()" and f.est_saving_s is None and f.data == {}
    assert torch_compile.findings({**MODEL, "compiled": True}, {}) == []
    assert torch_compile.findings(MODEL, {"dynamo_graphs": 2}) == []
    assert torch_compile.findings({}, {}) == []
    assert [x.id for x in setup_rules(MODEL, {}, None)][:1] == ["compile.none"]


def test_fix_times_it_as_the_torch_compile_candidate():
    found = [Finding(id="compile.none", severity=Severity.INFO, title="t")]
    assert kinds_from_findings(found) == [("compile", "compile.none")]
    built, skipped = build_candidates([("compile", "compile.none")], {"device": "cpu"}, FixConfig())
    assert skipped == [] and [(c.name, c.kind, c.overrides) for c in built] == [
        ("torch.compile", "compile", Overrides(compile=True))
    ]


def test_bench_rows_wrap_the_model_through_it(fake_compile):
    from pitstop.bench import session as session_mod
    from pitstop.bench.configs import BASELINE, ablation
    from pitstop.bench.workloads import WorkloadSpec, build_workload

    rows = {c.name: c for c in ablation("cpu", False, None)}
    assert rows["compile"].compile and rows["compile"].isolate and rows["compile"].knobs() == "torch.compile"
    assert rows["all_compiled"].compile and not rows["all"].compile
    wl = build_workload(WorkloadSpec("tabular", "tiny", batch_size=4))
    s = session_mod.Session(wl, rows["compile"], "cpu")
    assert isinstance(s.forward, CompiledWithFallback) and s.forward.module is s.model
    s.step()
    assert s.compile_error() is None
    s.close()
    base = session_mod.Session(wl, BASELINE, "cpu")
    assert base.forward is base.model and base.compile_error() is None
    base.close()


SCRIPT = """import os


def main():
    model = Net()
    for x, y in loader:
        loss = model(x).sum()
        loss.backward()
"""


def test_edit_compiles_the_model_after_its_line():
    fe = FileEdits(Path("train.py"), SCRIPT, SCRIPT)
    assert torch_compile.edit(ModelEditor(fe, 7, torch_compile.KNOB, True)) == {"compile": True}
    lines = fe.render().splitlines()
    at = lines.index("    model = Net()")
    # in place, as the timed run compiled it: torch.compile(model)'s wrapper would rename the state_dict keys
    assert lines[at + 1] == "    model.compile()" and "import torch" not in lines
