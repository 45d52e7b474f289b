"""Mixed precision by autocast (bf16 / fp16), the ``amp`` recipe: what pitstop knows about it, in one module
(``pitstop.recipes.component``'s layout; it wraps the forward instead of changing the model, so it is not
a model component: the registry's entry does not name it in ``component`` and its parts are called by
name). Which command calls which part:

- ``pitstop.train`` (``Amp``, ``TrainConfig.precision``) and ``pitstop bench``'s AMP rows: ``context``;
- ``pitstop profile --override autocast`` (``Knobs.autocast``, ``pitstop fix``'s runs): ``context`` around
  each top-level forward (``pitstop.profile.capture.models``);
- profile's exit probe: fp32 (``ARMS[0]``) against ``context`` (``ARMS[1]``), stored under ``PROBE``;
  ``as_ran``: the autocast a script's forward ran under, for every probe; ``PHASES`` bound its saving;
- ``pitstop fix``: ``cannot_help`` on the recorded models;
- a finding's code: ``SNIPPET``.

torch is imported only inside the functions that make a context, so the registry reads this without torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

NAME = "amp"
KNOB = "autocast"  # the ``Knobs`` field: "bfloat16" or "float16"
FINDING = "precision.amp"
PROBE = "precision"
ARMS = ("fp32", "amp")
PHASES = ("forward_s", "backward_s")  # the parts of the step its saving lives in
DTYPES = ("bfloat16", "float16")
SNIPPET = "with torch.autocast('{device}', dtype=torch.{dtype}):\n    loss = criterion(model(x), y)"


def context(device_type: str, dtype: Any) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` on ``device_type`` in ``dtype`` (a name in ``DTYPES`` or a ``torch.dtype``);
    a no-op for None (fp32)."""
    if dtype is None:
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type, dtype=getattr(torch, dtype) if isinstance(dtype, str) else dtype)


def as_ran(device_type: str, facts: Mapping[str, Any]) -> contextlib.AbstractContextManager[Any]:
    """The autocast a script's forward ran under (its recorded ``autocast``, ``autocast_dtype``), if any."""
    return context(device_type, facts.get("autocast_dtype") if facts.get("autocast") else None)


def cannot_help(models: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the change has nothing to act on: a recorded forward runs under autocast already."""
    if any(md.get("autocast") for md in models):
        return "amp: the script already runs its forward under autocast"
    return None

