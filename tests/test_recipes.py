"""pitstop.recipes: every optimization entry is complete and names code that exists; it agrees with the
knowledge profile, fix and bench still hold themselves."""

from __future__ import annotations

import dataclasses
import importlib
import string

import pytest

from pitstop.bench.configs import BenchConfig, ablation
from pitstop.profile.overrides import DATALOADER_KEYS, Overrides
from pitstop.recipes import BY_FINDING, BY_NAME, RECIPES, bench_title, recipe
from pitstop.train.trainer import TrainConfig

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
    assert bool(r.bench) == bool(r.bench_knob)
    if r.bench_knob:
        assert r.bench_knob in {f.name for f in dataclasses.fields(BenchConfig)}


def test_names_findings_and_bench_rows_are_unique():
    assert len(BY_NAME) == len(RECIPES)
    assert len(BY_FINDING) == len([r for r in RECIPES if r.finding])
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
            assert getattr(c, r.bench_knob) != getattr(default, r.bench_knob), (row, r.bench_knob)


def test_fix_candidates_agree_with_the_registry():
    from pitstop.tune.fix import FINDING_KINDS, KINDS

    for finding, kind in FINDING_KINDS.items():
        assert BY_NAME[kind].finding == finding
    assert set(KINDS) <= set(BY_NAME)


def test_probe_keys_are_results_the_probes_write():
    import inspect

    import pitstop.profile.probes as probes

    source = inspect.getsource(probes)
    for r in RECIPES:
        if r.probe:
            assert f'"{r.probe}"' in source, r.probe
