"""TF32 matmuls and convolutions on CUDA (Ampere and later), as one component (``pitstop.recipes.component``)
whose ``SURFACE`` is the process: a process-wide setting, the model and its code as they are. All that
pitstop knows and does about it.

TF32 tensor cores multiply fp32 inputs rounded to a 10-bit mantissa and accumulate in fp32: several times
the fp32 matmul rate, with a precision that training tolerates. torch leaves cuBLAS matmuls at full fp32
(``float32_matmul_precision`` "highest") and cuDNN convolutions on TF32. Which command calls which part:

- ``pitstop.train`` (``TrainConfig.tf32``, ``configure_backends``): ``apply``;
- ``pitstop bench``'s ``tf32`` row (CUDA only; ``Knobs.tf32``): ``scoped`` around each step (rows
  interleave in one process, so the setting is restored after each);
- ``pitstop profile --override tf32`` (``Knobs.tf32``, ``pitstop fix``'s runs): ``apply`` on the device of
  each model at its first forward (``pitstop.profile.capture.models``);
- profile's exit probe (CUDA, ``pitstop.profile.probe.gpu_probes``): where ``applies``, the pass as it
  ran (``ARMS[0]``) against ``changed`` (``ARMS[1]``), stored under ``PROBE``; profile's rules: ``RULE``
  (judged by ``rulekit.probe_finding``), ``PHASES`` bound its saving;
- ``pitstop fix``: ``cannot_help`` (no CUDA device, or the script allows TF32 already); ``fix --apply``:
  ``edit`` (``SNIPPET`` at the top of the script's main);
- a finding's code: ``SNIPPET``.

torch is imported only inside the functions that set it, so the registry reads this without torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pitstop.recipes.component import PROCESS, DeviceSettings, ProbeRule, scoped_arm
from pitstop.recipes.editing import ProcessEditor, edit_first_lines
from pitstop.recipes.entries import entry

NAME = "tf32"
KNOB = "tf32"  # the ``Knobs`` field that turns it on (bench, profile's injection; ``TrainConfig.tf32``)
SURFACE = PROCESS
FINDING = "precision.tf32"
CANDIDATE = "tf32"  # the name of ``pitstop fix``'s candidate
PROBE = "tf32"
ARMS = ("fp32", "tf32")
PHASES = ("forward_s", "backward_s")  # the parts of the step its saving lives in
SNIPPET = 'torch.set_float32_matmul_precision("high")\ntorch.backends.cudnn.allow_tf32 = True'
ON, OFF = "high", "highest"  # float32_matmul_precision with TF32 matmuls, without
MIN_CAPABILITY = (8, 0)  # Ampere: the first tensor cores with TF32

RULE = ProbeRule(
    NAME,
    title="fp32 matmuls run at full precision; TF32 tensor cores are faster here",
    evidence="forward+backward: float32_matmul_precision 'highest' {base}, 'high' (TF32) {new} (medians, "
    "measured after the run)",
    fix="Allow TF32 for matmuls (10-bit mantissa inputs, fp32 accumulation).",
    pass_title="TF32 measured no faster than full fp32 matmuls for this model",
    pass_evidence="'highest' {base}, 'high' {new}",
)

# its registry entry: name, snippet, finding, knob and probe are the constants above
RECIPE = entry(
    __name__,
    title="TF32 matmuls and convolutions",
    train="TrainConfig.tf32",
    bench=((NAME, "TF32 matmuls"),),
    apply="pitstop.fix.apply.apply_component",
)


def apply(device_type: str, on: bool) -> dict[str, Any]:
    """TF32 matmuls and cuDNN convolutions on (``float32_matmul_precision`` "high") or off ("highest")
    for the process, on CUDA; nothing elsewhere. What was set: ``{"tf32": on}``, or {} off CUDA."""
    if device_type != "cuda":
        return {}
    import torch

    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision(ON if on else OFF)
    return {KNOB: on}


@contextlib.contextmanager
def scoped(device_type: str, on: bool) -> Iterator[None]:
    """``apply`` for the block, the process's settings as they were after it."""
    import torch

    before = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    applied = apply(device_type, on)
    try:
        yield
    finally:
        if applied:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[:2]
            torch.set_float32_matmul_precision(before[2])


def applies(model: Mapping[str, Any], device: DeviceSettings) -> bool:
    """An fp32 model without autocast on a GPU with TF32, whose matmuls the script left at "highest": the
    probe has something to change."""
    fp32 = model.get("param_dtypes") == ["float32"] and not model.get("autocast")
    return fp32 and device.capability() >= MIN_CAPABILITY and device.get_matmul_precision() == OFF


def changed(fn: Callable[[], None], device: DeviceSettings) -> Callable[[], None]:
    """The probe's changed arm: ``fn`` run with matmul precision "high", the previous one restored after."""
    return scoped_arm(fn, device.get_matmul_precision, device.set_matmul_precision, ON)


def cannot_help(device_type: str, torch_facts: Mapping[str, Any]) -> str | None:
    """Why TF32 has nothing to change in a run on ``device_type`` whose torch settings at the end were
    ``torch_facts`` (``pitstop.profile.capture.facts.torch_facts``), or None: no CUDA device, or the
    script allows TF32 matmuls already."""
    if device_type != "cuda":
        return (
            f"tf32: no CUDA device in this run (TF32 is a mode of NVIDIA tensor cores, not of {device_type})"
        )
    precision = torch_facts.get("float32_matmul_precision")
    if torch_facts.get("tf32_matmul") or precision in (ON, "medium"):
        return f"tf32: the script allows TF32 matmuls already (float32_matmul_precision {precision!r})"
    return None


def edit(editor: ProcessEditor) -> dict[str, Any]:
    """``SNIPPET`` first in the script's main (or its ``__main__`` block, or after its imports), with
    ``import torch`` where the script has none."""
    return edit_first_lines(editor, SNIPPET, KNOB)
