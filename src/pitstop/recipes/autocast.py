"""Mixed precision by autocast (bf16 / fp16), the ``amp`` recipe, as one component
(``pitstop.recipes.component``) whose ``SURFACE`` is the forward: it wraps the forward in a context and
leaves the model as it is. All that pitstop knows and does about it; which command calls which part:

- ``pitstop.train`` (``Amp``, ``TrainConfig.precision``) and ``pitstop bench``'s AMP rows: ``context``;
- ``pitstop profile --override autocast`` (``Knobs.autocast``, ``pitstop fix``'s runs): ``context`` around
  each top-level forward (``pitstop.profile.capture.models``);
- profile's exit probe: fp32 (``ARMS[0]``) against ``context`` (``ARMS[1]``), stored under ``PROBE``;
  ``as_ran``: the autocast a script's forward ran under, for every probe; ``PHASES`` bound its saving;
- profile's rules: ``RULE`` with ``rule_fields`` (judged by ``rulekit.probe_finding``), ``unprobed``
  where the probe did not run;
- ``pitstop fix``: ``cannot_help`` on the recorded models, ``choose`` the dtype to try; ``fix --apply``:
  ``edit`` (forward and loss wrapped in ``with torch.autocast(...)``);
- a finding's code: ``SNIPPET``.

torch is imported only inside the functions that make a context or ask CUDA, so the registry reads this
without torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.host import cpu
from pitstop.host.precision import preferred_amp_dtype
from pitstop.matmul import fast_amp_dtype, slower_reason
from pitstop.recipes.component import FORWARD, ProbeRule
from pitstop.recipes.editing import ScriptEditor
from pitstop.recipes.entries import entry

NAME = "amp"
KNOB = "autocast"  # the ``Knobs`` field: "bfloat16" or "float16"
SURFACE = FORWARD
FINDING = "precision.amp"
PROBE = "precision"
ARMS = ("fp32", "amp")
PHASES = ("forward_s", "backward_s")  # the parts of the step its saving lives in
DTYPES = ("bfloat16", "float16")
SNIPPET = "with torch.autocast('{device}', dtype=torch.{dtype}):\n    loss = criterion(model(x), y)"
TITLE = "The model trains in fp32 on hardware with fast {dtype}"

RULE = ProbeRule(
    NAME,
    title=TITLE,
    evidence="forward+backward on the script's last batch: fp32 {base}, {dtype} autocast {new} (medians, "
    "measured after the run); this {device} has {hw}",
    fix="Run forward and loss under autocast({dtype}).{scaler}",
    pass_title="fp32 kept: {dtype} autocast measured to save under {bar} of the step here",
    pass_evidence="forward+backward: fp32 {base}, {dtype} {new}",
    at_model=True,
)

# its registry entry: name, snippet, finding, knob and probe are the constants above
RECIPE = entry(
    __name__,
    title="mixed precision (autocast)",
    train="TrainConfig.precision",
    bench=(("amp_bf16", "AMP bf16"), ("amp_fp16", "AMP fp16 + GradScaler")),
    apply="pitstop.fix.apply.apply_component",
    site="model",
)


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


def choose(device_type: str, requested: bool) -> str:
    """The dtype ``pitstop fix`` tries on this device (``pitstop.matmul.fast_amp_dtype``: the hardware's,
    a CPU's bf16 confirmed by a bounded matmul check; bfloat16 where it was ``requested`` on hardware
    without a fast one), or why none, as ``"amp: ..."``: no fast low-precision math, or bf16 matmuls
    measured slower than fp32 here (``pitstop.matmul.slower_reason``: requested, or promised by the flags)."""
    dtype = fast_amp_dtype(device_type)
    # where the flags promise bf16, the check that overruled them says why (the same, cached measurement)
    if dtype is None and not requested and not preferred_amp_dtype(device_type):
        return f"amp: this {device_type} has no fast low-precision math"
    if dtype is None and (slow := slower_reason("bfloat16", device_type)):
        return f"amp: {slow}"
    return dtype or "bfloat16"


def rule_fields(model: Mapping[str, Any], probe: Mapping[str, Any], device: str) -> dict[str, Any] | None:
    """The fields ``RULE``'s texts take beside the probe's: the hardware's fast path and, for float16,
    the GradScaler note; None where the probe timed no dtype (no fast low-precision path here)."""
    dtype = probe.get("dtype")
    if not dtype:
        return None
    return {
        "hw": "AVX512_BF16/AMX" if device == "cpu" else "tensor cores",
        "scaler": " With float16 on CUDA, use a GradScaler." if dtype == "float16" else "",
    }


def unprobed(model: Mapping[str, Any], device: str) -> list[Finding]:
    """fp32 on fast-low-precision hardware where the probe could not run (no inputs captured, too slow):
    an info finding that ``pitstop fix`` measures it. None for a model that autocasts already."""
    if not model or model.get("autocast") or model.get("param_dtypes") != ["float32"]:
        return []
    if device == "cpu" and not cpu.cpu_has_fast_bf16():
        return []
    if device not in ("cpu", "cuda"):
        return []
    dtype = preferred_amp_dtype(device)
    if not dtype:
        return []
    return [
        Finding(
            id=FINDING,
            severity=Severity.INFO,
            title=TITLE.format(dtype=dtype),
            evidence="autocast was off during forward; the gain could not be measured in this run "
            "(`pitstop fix` measures it)",
            fix=f"Run forward and loss under torch.autocast('{device}', dtype=torch.{dtype}).",
            fix_code=SNIPPET.format(device=device, dtype=dtype),
            location=model.get("first_location"),
        )
    ]


def edit(editor: ScriptEditor) -> dict[str, Any]:
    """The statements from the forward's up to the ``.backward()`` call (forward and loss, not the
    backward) wrapped in ``torch.autocast`` for the run's device in the fix's dtype (bfloat16 where it
    names none)."""
    editor.wrap_forward(
        f"with torch.autocast({editor.device!r}, dtype=torch.{editor.setting or 'bfloat16'}):"
    )
    editor.need_torch()
    return {KNOB: editor.setting}
