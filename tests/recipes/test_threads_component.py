"""The thread-count component (``pitstop.recipes.threads``): its process-wide setting, profile's injection
(which holds against the script's own ``set_num_threads``), fix's counts, the contention findings' fix
text and its ``fix --apply`` edit on a small script."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pitstop.fix.apply import FileEdits, ModelEditor
from pitstop.patching import Patches
from pitstop.recipes import component, components, recipe, threads
from pitstop.recipes.component import PROCESS


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_registry_entry_takes_its_names_from_the_module():
    r = recipe("threads")
    assert component("threads") is threads and threads in components(PROCESS)
    assert r.override == threads.KNOB and r.snippet == threads.SNIPPET and r.also == threads.ALSO
    assert r.apply == "pitstop.fix.apply.apply_component" and threads.PROBE is None


def test_apply_and_scoped_set_a_count(restore_threads):
    torch.set_num_threads(2)
    assert threads.apply("cpu", True) == {} and threads.apply("cuda", None) == {}  # no count named
    assert torch.get_num_threads() == 2
    with threads.scoped("cpu", 1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    assert threads.apply("cuda", 1) == {"num_threads": 1} and torch.get_num_threads() == 1


def test_inject_holds_the_count_against_the_script(restore_threads):
    patches = Patches()
    try:
        threads.inject(patches, 1)
        torch.set_num_threads(3)  # the script's own call
        assert torch.get_num_threads() == 1
    finally:
        patches.undo()
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2


def test_profile_injection_applies_each_knobs_value_to_each_model_and_threads_at_start(monkeypatch):
    """A process component's knob value reaches its ``apply`` at each model; the thread count is forced
    once, when the process starts (``threads.inject``), so the model's hook leaves it alone."""
    from types import SimpleNamespace

    from torch import nn

    from pitstop.profile.capture.models import ModelHooks
    from pitstop.profile.record.overrides import Overrides
    from pitstop.recipes import tf32

    seen = []
    monkeypatch.setattr(threads, "apply", lambda dev, on: seen.append(("threads", on)) or {})
    monkeypatch.setattr(tf32, "apply", lambda dev, on: seen.append(("tf32", on)) or {})
    cases = (
        (Overrides(num_threads=3), []),
        (Overrides(tf32=True, num_threads=3), [("tf32", True)]),
        (Overrides(), []),
    )
    for ov, want in cases:
        seen.clear()
        inst = SimpleNamespace(
            cfg=SimpleNamespace(overrides=ov), captured=SimpleNamespace(models=[]), model_facts={}
        )
        ModelHooks(inst).add_model(nn.Linear(2, 2))
        assert seen == want


def test_the_device_probes_pass_it_by():
    assert not threads.applies({}, object()) and threads.cannot_help("cpu", {}) is None
    fn = lambda: None  # noqa: E731
    assert threads.changed(fn, object()) is fn


def test_choose_the_counts_fix_times():
    assert threads.choose(2, 4, 8) == [2, 4]
    assert threads.choose(None, 4, 8) == [4]
    assert threads.choose(2, 4, 8, (3,)) == [3]
    assert isinstance(threads.choose(4, 4, 4), str)


def test_fix_text_names_the_count_and_the_workers():
    text, code = threads.fix_text(2, 4)
    assert "Run 2 intra-op threads" in text and "4 DataLoader workers" in text
    assert code.startswith("torch.set_num_threads(2)")
    assert (
        "Run 1 intra-op thread," in threads.fix_text(1, 0)[0]
        and "DataLoader" not in threads.fix_text(1, 0)[0]
    )


SCRIPT = """def main():
    model = Net()
"""


def test_edit_puts_the_count_first_in_main():
    fe = FileEdits(Path("train.py"), SCRIPT, SCRIPT)
    assert threads.edit(ModelEditor(fe, 0, threads.KNOB, 3, "cpu")) == {"threads": 3}
    lines = fe.render().splitlines()
    assert lines[0] == "import torch"
    at = lines.index("def main():")
    assert lines[at + 1].startswith("    torch.set_num_threads(3)") and lines[at + 2] == "    model = Net()"
    with pytest.raises(ValueError, match="no thread count"):
        threads.edit(ModelEditor(fe, 0, threads.KNOB, None, "cpu"))
