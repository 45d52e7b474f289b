"""profile's stage packages stay reachable by their dotted names: ``pitstop.profile`` exports ``run`` (the
function), so a stage called ``run`` would be shadowed for ``import pitstop.profile.run.x as y``,
``monkeypatch.setattr("pitstop.profile....")`` and ``mock.patch``, which all walk attributes."""

from __future__ import annotations

import importlib
import pkgutil

import pitstop
import pitstop.profile


def test_every_profile_module_is_reachable_by_attribute():
    for info in pkgutil.walk_packages(pitstop.profile.__path__, "pitstop.profile."):
        module = importlib.import_module(info.name)
        obj = pitstop
        for part in info.name.split(".")[1:]:
            obj = getattr(obj, part)
        assert obj is module, info.name
