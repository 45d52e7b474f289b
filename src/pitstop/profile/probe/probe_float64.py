"""The float64 probe: forward+backward of a float64 model on the script's last batch as it ran vs a
float32 copy of the model fed the batch in float32 (``pitstop.train.float32``), timed in rotating rounds
through the timing engine like the other model probes (``pitstop.profile.probe.probes``), so the saving comes
with its interval."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from pitstop.profile.probe.probe_kit import MAX_COPY_BYTES, as_script, fwd_bwd, saving, timed
from pitstop.train.float32 import float32_inputs, float32_model


def run(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    facts: dict[str, Any],
    base: Callable[[], None],
    dev: str,
) -> dict[str, Any]:
    """``base``: the script's forward+backward as it ran (float64). The probe's record: ``base_s``
    (float64), ``new_s`` (float32), ``saving_s`` and its interval, or ``skipped`` and why."""
    if facts.get("param_bytes", 0) * 1.5 > MAX_COPY_BYTES:  # the float64 copy, then its float32 grads
        return {"dtype": "float32", "skipped": "model too large to copy for the probe"}
    f32 = float32_model(copy.deepcopy(model))
    f32_args, f32_kwargs = float32_inputs((args, kwargs))

    def fp32() -> None:
        with as_script(dev, facts):
            fwd_bwd(f32, f32_args, f32_kwargs)

    return {
        "dtype": "float32",
        **saving(timed({"float64": base, "float32": fp32}, dev), "float64", "float32"),
    }
