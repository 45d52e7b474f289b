"""Autocast (bf16/fp16) in one module: the registry's amp entry, train's Amp, profile's injection and
probe, and fix's cannot_help come from it."""

import pytest

from pitstop.recipes import autocast, recipe
from pitstop.recipes.knobs import AUTOCAST_DTYPES, knob_fields


def test_the_registry_entry_takes_its_names_from_the_module():
    r = recipe(autocast.NAME)
    assert (r.snippet, r.finding, r.probe, r.override) == (
        autocast.SNIPPET,
        autocast.FINDING,
        autocast.PROBE,
        autocast.KNOB,
    )
    assert autocast.KNOB in knob_fields() and set(autocast.DTYPES) == AUTOCAST_DTYPES


def test_context_by_name_by_dtype_and_fp32():
    torch = pytest.importorskip("torch")
    with autocast.context("cpu", "bfloat16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with autocast.context("cpu", torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")
    with autocast.context("cpu", None):
        assert not torch.is_autocast_enabled("cpu")
    with autocast.as_ran("cpu", {"autocast": True, "autocast_dtype": "bfloat16"}):
        assert torch.is_autocast_enabled("cpu")
    with autocast.as_ran("cpu", {"autocast": False, "autocast_dtype": "bfloat16"}):
        assert not torch.is_autocast_enabled("cpu")


def test_cannot_help_where_the_script_autocasts_already():
    assert autocast.cannot_help([{"autocast": True}])
    assert autocast.cannot_help([{"autocast": False}, {}]) is None
