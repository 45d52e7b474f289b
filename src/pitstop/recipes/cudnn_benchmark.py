"""cuDNN autotuning (``torch.backends.cudnn.benchmark``) on CUDA, as one component
(``pitstop.recipes.component``) whose ``SURFACE`` is the process: a process-wide setting, the model and its
code as they are. All that pitstop knows and does about it.

With ``benchmark`` on, cuDNN times its convolution algorithms for each new input shape and keeps the
fastest; torch leaves it off, so each convolution runs cuDNN's heuristic pick. The tuning pays once per
shape: inputs whose shapes change every step re-tune each time. Which command calls which part:

- ``pitstop.train`` (``TrainConfig.cudnn_benchmark``, ``configure_backends``): ``apply``;
- ``pitstop bench`` (``Knobs.cudnn_benchmark``; no row sets it): ``scoped`` around each step;
- ``pitstop profile --override cudnn_benchmark`` (``Knobs.cudnn_benchmark``, ``pitstop fix``'s runs):
  ``apply`` on the device of each model at its first forward (``pitstop.profile.capture.models``);
- profile's exit probe (CUDA, ``pitstop.profile.probe.gpu_probes``): where ``applies`` (a conv net, the
  script left it off), the pass as it ran (``ARMS[0]``) against ``changed`` (``ARMS[1]``), stored under
  ``PROBE``; profile's rules: ``RULE`` (judged by ``rulekit.probe_finding``), ``PHASES`` bound its saving;
- ``pitstop fix``: ``cannot_help`` (no CUDA device), its candidate named ``CANDIDATE``; ``fix --apply``:
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

NAME = "cudnn_benchmark"
KNOB = "cudnn_benchmark"  # the ``Knobs`` field that turns it on (``TrainConfig.cudnn_benchmark`` too)
SURFACE = PROCESS
FINDING = "cudnn.benchmark"
CANDIDATE = "cudnn.benchmark"  # the name of ``pitstop fix``'s candidate
PROBE = "cudnn_benchmark"
ARMS = ("off", "on")
PHASES = ("forward_s", "backward_s")  # the parts of the step its saving lives in
SNIPPET = "torch.backends.cudnn.benchmark = True"

RULE = ProbeRule(
    NAME,
    title="cudnn.benchmark is off for a conv net with fixed input shapes",
    evidence="forward+backward: benchmark off {base}, on {new}",
    fix="Let cuDNN pick the fastest convolution algorithms (input shapes must not change every step).",
)

# its registry entry: name, snippet, finding, knob and probe are the constants above
RECIPE = entry(
    __name__,
    title="cuDNN autotuning",
    train="TrainConfig.cudnn_benchmark",
    apply="pitstop.fix.apply.apply_component",
)


def apply(device_type: str, on: bool) -> dict[str, Any]:
    """cuDNN autotuning on (or off) for the process, on CUDA; nothing elsewhere. What was set:
    ``{"cudnn_benchmark": on}``, or {} off CUDA."""
    if device_type != "cuda":
        return {}
    import torch

    torch.backends.cudnn.benchmark = on
    return {KNOB: on}


@contextlib.contextmanager
def scoped(device_type: str, on: bool) -> Iterator[None]:
    """``apply`` for the block, the process's setting as it was after it."""
    import torch

    before = torch.backends.cudnn.benchmark
    applied = apply(device_type, on)
    try:
        yield
    finally:
        if applied:
            torch.backends.cudnn.benchmark = before


def applies(model: Mapping[str, Any], device: DeviceSettings) -> bool:
    """A model with 2-d convolutions, autotuning left off by the script: the probe has something to change."""
    return bool(model.get("conv2d_layers")) and not device.get_cudnn_benchmark()


def changed(fn: Callable[[], None], device: DeviceSettings) -> Callable[[], None]:
    """The probe's changed arm: ``fn`` run with autotuning on, the previous setting restored after."""
    return scoped_arm(fn, device.get_cudnn_benchmark, device.set_cudnn_benchmark, True)


def cannot_help(device_type: str, torch_facts: Mapping[str, Any]) -> str | None:
    """Why autotuning has nothing to change in a run on ``device_type`` (no CUDA device), or None."""
    if device_type != "cuda":
        return f"{NAME}: no CUDA device in this run"
    return None


def edit(editor: ProcessEditor) -> dict[str, Any]:
    """``SNIPPET`` first in the script's main (or its ``__main__`` block, or after its imports), with
    ``import torch`` where the script has none."""
    return edit_first_lines(editor, SNIPPET, KNOB)
