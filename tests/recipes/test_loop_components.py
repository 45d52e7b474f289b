"""The training loop's own components: gradient accumulation with DDP's no_sync and static_graph
(``step``), keep_host_memory (``host_memory``) and activation checkpointing (``activation_checkpointing``)."""

from __future__ import annotations

import subprocess
import sys

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
