"""The training loop's own components: gradient accumulation with DDP's no_sync and static_graph
(``step``), keep_host_memory (``host_memory``) and activation checkpointing (``activation_checkpointing``);
the findings the first two make of profile's data, and profile's rules calling them."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pitstop.train as train
from pitstop.recipes import activation_checkpointing, component, components, host_memory, recipe, step
from pitstop.recipes.component import BLOCKS, HOST, LOOP_SURFACES, STEP, SURFACES


def test_each_declares_its_surface_and_its_entry_names_it() -> None:
    for mod, surface in ((step, STEP), (host_memory, HOST), (activation_checkpointing, BLOCKS)):
        assert surface == mod.SURFACE and surface in LOOP_SURFACES and surface not in SURFACES
        assert component(mod.NAME) is mod
        assert recipe(mod.NAME).snippet == mod.SNIPPET and recipe(mod.NAME).finding == mod.FINDING
    assert recipe(step.STATIC_GRAPH).override == step.STATIC_GRAPH_KNOB
    assert recipe(step.ACCUMULATION).snippet == step.ACCUMULATION_SNIPPET


def test_generic_callers_see_them_only_by_their_surface() -> None:
    assert not {c.NAME for c in components()} & {step.NAME, host_memory.NAME, activation_checkpointing.NAME}
    assert [c.NAME for c in components(STEP)] == [step.NAME]
    assert [c.NAME for c in components(HOST, BLOCKS)] == [host_memory.NAME, activation_checkpointing.NAME]


def test_train_serves_their_parts_under_its_public_names() -> None:
    assert train.no_sync_every is step.no_sync_every and train.accumulate is step.accumulate
    assert train.keep_host_memory is host_memory.keep_host_memory
    assert train.apply_activation_checkpointing is activation_checkpointing.apply_activation_checkpointing
    from pitstop.train.memory import activation_memory_saving

    assert train.activation_memory_saving is activation_memory_saving


def test_the_fix_apply_lines_are_the_ones_fix_writes() -> None:
    assert step.EDIT_LINE.format(k=4) == "no_sync_every(4)  # DDP all-reduces once per optimizer step"
    assert step.EDIT_IMPORT == "from pitstop.train import no_sync_every"
    assert (host_memory.EDIT_LINE, host_memory.EDIT_IMPORT) == (
        "keep_host_memory()",
        "from pitstop.train import keep_host_memory",
    )


def test_the_registry_reads_them_without_torch() -> None:
    code = (
        "import sys\n"
        "from pitstop.recipes import activation_checkpointing, host_memory, step\n"
        "from pitstop.train import keep_host_memory\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_host_memorys_rule_makes_its_finding_and_profile_calls_it() -> None:
    from types import SimpleNamespace

    from pitstop.findings import Severity
    from pitstop.profile.analyze import rulekit
    from pitstop.profile.analyze.rules_compute import host_memory_rules

    bd = SimpleNamespace(faults_per_step=4000, total_s=0.05)
    probe = {
        "kept": False,
        "base_s": 0.1,
        "new_s": 0.05,
        "saving_s": 0.05,
        "base_faults": 5000,
        "new_faults": 100,
    }
    [f] = host_memory.rules(bd, probe, rulekit)
    assert f.id == host_memory.FINDING == "host.page_faults" and f.severity is Severity.WARN
    assert f.title == "CPU steps page-fault their tensors in: malloc returns freed memory to the kernel"
    assert f.evidence.startswith(
        "4,000 minor page faults per step in the run (mean); a training step on the "
    )
    assert f.fix_code.startswith(host_memory.SNIPPET + "\n# or: pitstop launch --allocator glibc -- train.py")
    assert f.data["faults_per_step"] == 4000 and f.est_saving_s == f.data["est_saving_s"]
    assert host_memory_rules(bd, {host_memory.PROBE: probe}) == [f]  # profile's rule is the thin call
    [kept] = host_memory.rules(bd, {"kept": True, "skipped": "jemalloc is preloaded"}, rulekit)
    assert kept.severity is Severity.PASS and kept.evidence.startswith("jemalloc is preloaded; 4,000 minor")
    assert host_memory.rules(bd, None, rulekit) == []


def _rank(rounds: float = 1.0, ddp: list[dict] | None = None) -> dict:
    comm = {"ddp_rounds": rounds, "ddp_exposed_s": 0.04, "ddp_comm_s": 0.08, "ddp_bytes": 4 * 2**20 * rounds}
    return {
        "rank": 1,
        "breakdown": {"mean_step_s": 0.2},
        "ddp": ddp or [],
        "comm_per_step": {**comm, "unused_search_s": 0.02},
    }


def test_the_step_components_rules_make_their_findings_and_dist_rules_calls_them() -> None:
    from pitstop.findings import Severity
    from pitstop.profile.analyze import dist_rules

    f = step.no_sync_rule([_rank(4.0)], 0.05)
    assert f is not None and f.id == step.FINDING == "ddp.no_sync" and f.severity is Severity.WARN
    assert f.title == "Gradient accumulation all-reduces every micro-batch: 3.0 extra all-reduces per step"
    assert f.evidence == (
        "rank 1: 4.0 DDP gradient all-reduces per optimizer step (4.00 MiB each, 80 ms in all, 40 ms exposed "
        "per step); only the last one before optimizer.step() is needed"
    )
    assert f.data == {"rank": 1, "rounds_per_step": 4.0, "extra_rounds": 3.0, "cost_s": 0.03}
    assert dist_rules.no_sync([_rank(4.0)]) == f and step.no_sync_rule([_rank(1.0)], 0.05) is None
    ddp = [{"find_unused_parameters": True, "unused_parameters": 0, "parameters": 6, "location": "t.py:3"}]
    g = step.static_graph_rule([_rank(ddp=ddp)], 0.05)
    assert g is not None and g.id == step.STATIC_GRAPH_FINDING == "ddp.find_unused_parameters"
    assert g.title == "DDP searches the autograd graph for unused parameters every step"
    assert g.evidence.endswith("every one of the 6 parameters got a gradient: the flag is not needed")
    assert g.severity is Severity.WARN and g.location == "t.py:3" and g.share == pytest.approx(0.1)
    assert dist_rules.find_unused([_rank(ddp=ddp)]) == g and step.static_graph_rule([_rank()], 0.05) is None
