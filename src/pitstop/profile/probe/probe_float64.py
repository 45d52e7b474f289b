"""The probe of a dtype component (``pitstop.recipes.component.DtypeComponent``: float32 for a float64
model): forward+backward of the model on the script's last batch as it ran vs a copy changed by the
component's ``apply_model`` fed its ``apply_input``, timed in rotating rounds through the timing engine like
the other model probes (``pitstop.profile.probe.probes``), so the saving comes with its interval."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from pitstop.profile.probe.probe_kit import MAX_COPY_BYTES, as_script, fwd_bwd, saving, timed

if TYPE_CHECKING:
    from pitstop.recipes.component import DtypeComponent


def run(
    comp: DtypeComponent,
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    facts: dict[str, Any],
    base: Callable[[], None],
    dev: str,
) -> dict[str, Any]:
    """``base``: the script's forward+backward as it ran (``comp.ARMS[0]``, float64). The probe's record:
    ``dtype`` (the changed arm's), ``base_s``, ``new_s``, ``saving_s`` and its interval, or ``skipped`` and
    why."""
    was, new = comp.ARMS
    if facts.get("param_bytes", 0) * 1.5 > MAX_COPY_BYTES:  # the float64 copy, then its float32 grads
        return {"dtype": new, "skipped": "model too large to copy for the probe"}
    changed_model = comp.apply_model(copy.deepcopy(model))
    new_args, new_kwargs = comp.apply_input((args, kwargs))

    def changed() -> None:
        with as_script(dev, facts):
            fwd_bwd(changed_model, new_args, new_kwargs)

    return {"dtype": new, **saving(timed({was: base, new: changed}, dev), was, new)}
