"""pitstop.recipes: every optimization entry is complete and names code that exists; it agrees with the
knowledge profile, fix and bench still hold themselves."""

from __future__ import annotations

import dataclasses
import importlib
import re
import string

import pytest

from pitstop.bench.configs import BenchConfig, ablation
from pitstop.profile.record.overrides import DATALOADER_KEYS, Overrides
from pitstop.recipes import BY_FINDING, BY_NAME, RECIPES, bench_title, component, recipe
from pitstop.recipes.component import (
    BLOCKS,
    DTYPE,
    FORWARD,
    HOST,
    LOADER,
    MODEL,
    OPTIMIZER,
    PROCESS,
    STEP,
    WRAP,
)
from pitstop.train.config import TrainConfig

SNIPPET_FIELDS = {"device", "dtype", "impl", "optimizer", "value"}


def _resolve(dotted: str) -> object:
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


@pytest.mark.parametrize("r", RECIPES, ids=lambda r: r.name)
def test_every_entry_is_complete_and_its_references_exist(r):
    assert r.name and r.title and r.snippet.strip()
    assert r.finding or r.bench or r.train, "an entry nobody recommends, enables or measures"
    fields = {f for _, f, _, _ in string.Formatter().parse(r.snippet) if f}
    assert fields <= SNIPPET_FIELDS, fields
    if r.override:
        head, _, key = r.override.partition(".")
        assert head in {f.name for f in dataclasses.fields(Overrides)}
        if head == "dataloader":
            assert key in DATALOADER_KEYS
    if r.train:
        if r.train.startswith("TrainConfig."):
            assert r.train.split(".", 1)[1] in {f.name for f in dataclasses.fields(TrainConfig)}
        else:
            assert callable(_resolve(r.train))
    if r.apply:
        assert callable(_resolve(r.apply))
    if r.component:  # its parts, and the entry's fields that name them
        comp = component(r.name)
        assert comp is not None and r.name == comp.NAME and r.snippet == comp.SNIPPET
        if comp.SURFACE in (STEP, HOST, BLOCKS):  # the training loop's own: no probe rule
            assert (r.finding, r.override) == (comp.FINDING, comp.KNOB)
            loop_parts = {
                STEP: ("accumulate", "scale_loss", "sync_context", "no_sync_every", "install"),
                HOST: ("keep_host_memory", "kept", "blocker", "minor_page_faults"),
                BLOCKS: ("apply_activation_checkpointing", "remove_activation_checkpointing"),
            }[comp.SURFACE]
            assert all(callable(getattr(comp, f)) for f in loop_parts)
        else:
            assert comp.RULE.recipe == r.name and (r.finding, r.probe) == (comp.FINDING, comp.PROBE)
            parts = {  # the parts of its surface (pitstop.recipes.component's protocols)
                MODEL: ("applies", "cannot_help", "apply_model", "apply_input", "rule_fields", "edit"),
                FORWARD: ("context", "as_ran", "choose", "cannot_help", "rule_fields", "unprobed", "edit"),
                OPTIMIZER: ("kwargs", "inject", "changed", "choose", "cannot_help", "rules", "edit"),
                PROCESS: ("apply", "scoped", "applies", "changed", "cannot_help", "edit"),
                DTYPE: ("applies", "apply_model", "apply_input", "apply_output", "unprobed", "edit"),
                WRAP: ("wrap", "failed", "inner", "install", "inject", "model_facts", "findings", "edit"),
                LOADER: ("apply_loader_kwargs", "facts", "candidates", "rules", "edit"),
            }[comp.SURFACE]
            assert all(callable(getattr(comp, f)) for f in parts)
    if r.bench:  # the rows set the entry's knob, or a field only a bench row has
        assert r.bench_knob or r.override
    assert not (r.bench_knob and r.override), "a bench row sets the entry's knob"
    if r.bench_knob:
        assert r.bench_knob in {f.name for f in dataclasses.fields(BenchConfig)}


# the registry's order as fix's candidates, bench's rows, the docs' tables and the tests rely on it
REGISTRY_ORDER = (
    "workers",
    "persistent_workers",
    "pin_memory",
    "amp",
    "float32",
    "channels_last",
    "foreach",
    "compile",
    "cudnn_benchmark",
    "host_memory",
    "tf32",
    "activation_checkpointing",
    "accumulation",
    "no_sync",
    "static_graph",
    "threads",
)


def test_registry_order_is_the_modules_order():
    from pitstop.recipes.registry import MODULES, declared

    assert tuple(r for m in MODULES for r in declared(m)) == RECIPES
    assert tuple(r.name for r in RECIPES) == REGISTRY_ORDER


def test_each_component_module_declares_its_entries_from_its_constants():
    """Adding an optimization is its module, whose entry it declares, plus one line in ``MODULES``: every
    module of ``pitstop.recipes`` that is a component or declares an entry is listed, and each entry's
    copied fields are its component's constants."""
    import pkgutil

    import pitstop.recipes as pkg
    from pitstop.recipes.registry import MODULES, declared

    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        declares = any(hasattr(mod, a) for a in ("SURFACE", "RECIPE", "RECIPES"))
        if declares and info.name != "registry":
            assert mod in MODULES, f"{mod.__name__} is not in registry.MODULES"
    for m in MODULES:
        assert hasattr(m, "RECIPE") != hasattr(m, "RECIPES"), m.__name__
        for r in declared(m):
            if r.component is None:  # an entry with no component of its own (step's accumulation)
                continue
            module, _, attr = r.component.partition(":")
            assert module == m.__name__, r.name
            comp = getattr(m, attr) if attr else m
            assert comp is component(r.name)
            fields = (r.name, r.snippet, r.finding, r.also, r.override, r.probe)
            consts = (comp.NAME, comp.SNIPPET, comp.FINDING, getattr(comp, "ALSO", ()), comp.KNOB)
            assert fields == (*consts, getattr(comp, "PROBE", None)), r.name


def test_entry_reads_a_new_components_constants(monkeypatch):
    """``entries.entry`` builds a module's entry from its constants (a module passes its ``__name__``)."""
    import sys
    import types

    from pitstop.recipes.entries import entry

    mod = types.ModuleType("fake_component")
    mod.NAME, mod.KNOB, mod.FINDING, mod.PROBE, mod.SNIPPET = "fake", "compile", "fake.slow", "fake", "f()"
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    r = entry(mod.__name__, title="fake switch", bench=(("fake", "fake"),), site="model")
    assert (r.name, r.title, r.snippet, r.finding, r.also) == ("fake", "fake switch", "f()", "fake.slow", ())
    assert (r.override, r.probe) == ("compile", "fake")
    assert (r.component, r.bench, r.site, r.fix) == ("fake_component", (("fake", "fake"),), "model", True)
    mod.RECORD = types.SimpleNamespace(NAME="rec", KNOB=None, FINDING=None, SNIPPET="g()", ALSO=("x.y",))
    r = entry(mod.__name__, "RECORD", title="a record")
    assert (r.name, r.override, r.finding, r.also, r.probe) == ("rec", None, None, ("x.y",), None)
    assert r.component == "fake_component:RECORD"


def test_names_findings_and_bench_rows_are_unique():
    assert len(BY_NAME) == len(RECIPES)
    assert len(BY_FINDING) == sum(len(r.findings) for r in RECIPES)
    rows = [row for r in RECIPES for row, _ in r.bench]
    assert len(rows) == len(set(rows))
    with pytest.raises(KeyError, match="known"):
        recipe("nope")


def test_bench_rows_of_an_entry_set_its_knob():
    configs = {c.name: c for c in ablation("cuda", True, "bfloat16")}
    default = BenchConfig("x", "x")
    for r in RECIPES:
        for row, title in r.bench:
            c = configs[row]
            assert c.title == title == bench_title(row)
            assert _knob(c, r) != _knob(default, r), (row, r.bench_knob or r.override)


def _knob(config, r):
    """The value a bench row sets for entry ``r``: its knob (``override``) or its ``bench_knob``."""
    head, _, key = (r.bench_knob or r.override).partition(".")
    return config.dataloader.get(key) if head == "dataloader" else getattr(config, head)


def test_fix_candidates_agree_with_the_registry():
    from pitstop.fix.core import FINDING_KINDS, KINDS

    for finding, kind in FINDING_KINDS.items():
        assert finding in BY_NAME[kind].findings
    assert set(KINDS) <= set(BY_NAME)


def test_probe_keys_are_results_the_probes_write():
    import inspect

    import pitstop.profile.probe.gpu_probes as gpu_probes
    import pitstop.profile.probe.probes as probes

    # run_probes writes its own keys and, on CUDA, gpu_probes.run's; a component's probe writes its PROBE
    source = inspect.getsource(probes) + inspect.getsource(gpu_probes)
    for r in RECIPES:
        if r.probe and r.component:
            assert r.probe == component(r.name).PROBE and "comp.PROBE" in source, r.probe
        elif r.probe:
            assert f'"{r.probe}"' in source, r.probe


def _profile_source() -> str:
    import pathlib

    import pitstop.profile as profile

    return "\n".join(p.read_text() for p in sorted(pathlib.Path(profile.__file__).parent.rglob("*.py")))


@pytest.mark.parametrize("r", [r for r in RECIPES if r.finding], ids=lambda r: r.name)
def test_every_finding_id_is_emitted_by_a_profile_rule(r):
    """A rule names the id as a literal, through its recipe, or through a ProbeRule of the recipe (a
    component's ``RULE``, which profile's rules list), or a training-loop component's rule makes it."""
    source = _profile_source()
    comp = component(r.name)
    assert (
        f'id="{r.finding}"' in source
        or f'recipe("{r.name}").finding' in source
        or re.search(rf'ProbeRule\(\s*"{r.name}"', source)
        or (comp is not None and r.finding == comp.FINDING and f"{r.name}.RULE" in source)
        or _loop_ruled(r.finding, source)
        or (comp is not None and r.finding == comp.FINDING and _ruled(comp))
    ), r.finding


def _loop_ruled(finding: str, source: str) -> bool:
    """Whether a training-loop component (no ``RULE``) makes the finding: a function of its module that
    passes the constant naming the id as ``id=``, and that profile's rules call."""
    import ast
    import inspect

    from pitstop.recipes import components
    from pitstop.recipes.component import LOOP_SURFACES

    for mod in components(*LOOP_SURFACES):
        names = {k for k, v in vars(mod).items() if k.isupper() and v == finding}
        short = mod.__name__.rsplit(".", 1)[1]
        for fn in ast.walk(ast.parse(inspect.getsource(mod))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            called = f"{short}.{fn.name}(" in source or (
                f"from {mod.__name__} import" in source and re.search(rf"\b{fn.name}\(", source)
            )
            makes = any(
                isinstance(k, ast.keyword)
                and k.arg == "id"
                and isinstance(k.value, ast.Name)
                and k.value.id in names
                for k in ast.walk(fn)
            )
            if called and makes:
                return True
    return False


def _ruled(comp) -> bool:
    """Whether profile's rules judge the component: its RULE among the probe rules, or its ``rules`` (or,
    for a process component, its RULE) called for every component of its surface."""
    from pitstop.profile.analyze import rules_compute

    return comp.RULE in rules_compute.PROBE_RULES or (
        comp.SURFACE in (OPTIMIZER, PROCESS, DTYPE, WRAP, LOADER)
        and f"components({comp.SURFACE.upper()})" in _profile_source()
    )


def test_an_entry_acts_on_each_of_its_findings():
    """``also``: the threads entry acts on the contention findings too; every lookup sees them, and a
    profile rule emits each of them."""
    from pitstop.recipes import by_finding, finding_kinds

    threads = recipe("threads")
    assert threads.findings == ("distributed.threads", "host.oversubscribed", "host.contention")
    source = _profile_source()
    for fid in threads.findings:
        assert by_finding(fid) is threads and BY_FINDING[fid] is threads
        assert finding_kinds()[fid] == "threads"
    for r in RECIPES:
        for fid in r.also:
            assert f'"{fid}"' in source, fid


def test_probe_rules_name_recipes_that_probe():
    from pitstop.profile.analyze.rules_compute import PROBE_RULES
    from pitstop.recipes import components

    # (a process component without a generic probe, threads, is judged by the contention rules)
    for rule in (*PROBE_RULES, *(c.RULE for c in components(PROCESS, DTYPE) if c.PROBE)):
        assert recipe(rule.recipe).probe and recipe(rule.recipe).finding, rule.recipe


def test_a_new_entry_is_a_fix_candidate_picked_by_its_finding(monkeypatch):
    """Adding an optimization is one entry: fix's kinds, finding map, parsing and candidates follow."""
    from pitstop.findings import Finding, Severity
    from pitstop.fix.core import FixConfig, build_candidates, kinds_from_findings, parse_candidates
    from pitstop.recipes import Recipe, registry

    fake = Recipe("fake", "fake switch", "fake()", finding="fake.slow", override="compile")
    monkeypatch.setattr(registry, "RECIPES", (*registry.RECIPES, fake))
    assert "fake" in registry.fix_kinds() and registry.finding_kinds()["fake.slow"] == "fake"
    assert parse_candidates("fake") == ("fake",) and "fake" in parse_candidates("all")
    found = [Finding(id="fake.slow", severity=Severity.WARN, title="t", est_saving_s=0.1)]
    assert kinds_from_findings(found) == [("fake", "fake.slow")]
    built, skipped = build_candidates([("fake", "fake.slow")], {}, FixConfig())
    assert skipped == [] and [(c.name, c.kind, c.overrides) for c in built] == [
        ("fake switch", "fake", Overrides(compile=True))
    ]
    untimed = Finding(id="fake.slow", severity=Severity.INFO, title="t")
    assert kinds_from_findings([untimed]) == []
    monkeypatch.setattr(
        registry, "RECIPES", (*registry.RECIPES[:-1], dataclasses.replace(fake, untimed=True))
    )
    assert kinds_from_findings([untimed]) == [("fake", "fake.slow")]


def test_overrides_setting_names_a_field_or_a_loader_keyword():
    assert Overrides.setting("dataloader.pin_memory", True) == Overrides(dataloader={"pin_memory": True})
    assert Overrides.setting("keep_host_memory", True) == Overrides(keep_host_memory=True)
    with pytest.raises(ValueError):
        Overrides.setting("nope", True)
    values = {"autocast": "bfloat16", "optimizer_impl": "foreach", "num_threads": 2, "ddp_no_sync": 4}
    for r in RECIPES:
        if r.override:
            assert not Overrides.setting(r.override, values.get(r.override, True)).is_empty()


def test_dataloader_overrides_are_real_dataloader_keywords():
    import inspect

    from torch.utils.data import DataLoader

    params = inspect.signature(DataLoader).parameters
    assert set(params) >= DATALOADER_KEYS
