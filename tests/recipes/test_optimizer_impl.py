"""The optimizer implementation (foreach / fused) in one module: the registry's foreach entry, the
profile injection, the probe's changed arm, fix's choice and make_optimizer's keyword come from it."""

import pytest

from pitstop.recipes import optimizer_impl, recipe
from pitstop.recipes.knobs import OPTIMIZER_IMPLS, knob_fields


def test_the_registry_entry_takes_its_names_from_the_module():
    r = recipe(optimizer_impl.NAME)
    assert (r.snippet, r.finding, r.probe, r.override) == (
        optimizer_impl.SNIPPET,
        optimizer_impl.FINDING,
        optimizer_impl.PROBE,
        optimizer_impl.KNOB,
    )
    assert optimizer_impl.KNOB in knob_fields() and set(optimizer_impl.IMPLS) == OPTIMIZER_IMPLS


def test_inject_turns_one_implementation_on_and_the_other_off():
    d = {"lr": 1e-3, "foreach": None, "fused": None}
    assert optimizer_impl.inject(d, "foreach") == ({"lr": 1e-3, "foreach": True, "fused": None}, "foreach")
    assert optimizer_impl.inject(d, "fused") == ({"lr": 1e-3, "foreach": False, "fused": True}, "fused")
    assert optimizer_impl.inject({"lr": 1}, "fused") == ({"lr": 1}, None)  # no such option: as it is
    assert optimizer_impl.inject(d, None) == (d, None)


def test_fix_choice_and_what_cannot_help():
    assert optimizer_impl.choose("cuda") == "fused" and optimizer_impl.choose("cpu") == "foreach"
    assert optimizer_impl.cannot_help([{"impl": "fused"}, {"impl": "foreach"}])
    assert optimizer_impl.cannot_help([{"impl": "for-loop"}]) is None
    assert optimizer_impl.cannot_help([]) is None
    assert optimizer_impl.kwargs(True) == {"fused": True} and optimizer_impl.kwargs(False) == {"foreach": True}


def test_changed_arm_is_a_foreach_copy():
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1, foreach=False)
    new = optimizer_impl.changed(opt)
    assert new is not opt and all(g["foreach"] for g in new.param_groups)
    assert not opt.param_groups[0]["foreach"]
