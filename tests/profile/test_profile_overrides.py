"""Overrides: validated up front, JSON round trip, and the DataLoader kwargs they force."""

from __future__ import annotations

import json

import pytest

from pitstop.profile.capture.loaders import apply_loader_overrides as _apply_loader_overrides
from pitstop.profile.record.overrides import Overrides


def test_round_trip_and_empty():
    ov = Overrides(dataloader={"num_workers": 2, "pin_memory": True}, autocast="bfloat16", compile=True)
    assert Overrides.from_dict(json.loads(json.dumps(ov.to_dict()))) == ov
    assert Overrides().is_empty() and not ov.is_empty()
    assert ov.describe() == "num_workers=2, pin_memory=True, autocast=bfloat16, compile=True"
    assert Overrides().describe() == "none"


@pytest.mark.parametrize(
    "kw",
    [{"dataloader": {"shuffle": False}}, {"autocast": "int8"}, {"optimizer_impl": "magic"}],
)
def test_bad_overrides_are_rejected_with_a_message(kw):
    with pytest.raises(ValueError):
        Overrides(**kw)


def test_loader_override_rules():
    kw = {"batch_size": 8, "num_workers": 4, "prefetch_factor": 2, "persistent_workers": True}
    applied, skipped = _apply_loader_overrides(kw, {"num_workers": 0})
    assert applied == {"num_workers": 0} and skipped == {}
    assert kw["prefetch_factor"] is None and kw["persistent_workers"] is False  # DataLoader would reject them

    kw = {"batch_sampler": object(), "num_workers": 0}
    applied, skipped = _apply_loader_overrides(kw, {"batch_size": 64, "num_workers": 2, "prefetch_factor": 4})
    assert applied == {"num_workers": 2, "prefetch_factor": 4}
    assert "batch_sampler" in skipped["batch_size"]
