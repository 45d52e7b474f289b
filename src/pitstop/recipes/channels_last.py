"""channels_last (NHWC) for conv nets, as one component (``pitstop.recipes.component``): all that pitstop
knows and does about it.

oneDNN on CPU and cuDNN tensor cores run NHWC convolutions faster. Both the model and its 4-D inputs must
be converted; a mismatch makes every conv convert on the fly. Which command calls which part:

- ``pitstop.train`` (``TrainConfig.channels_last``: ``wanted``, its "auto" rule; ``DevicePrefetcher``) and
  ``pitstop bench`` (a row whose ``Knobs.channels_last`` is on): ``apply_model``, ``apply_input``; ``pitstop.train`` also ``train_model`` (``keep_grad_nhwc``);
- ``pitstop profile --override channels_last`` (and ``pitstop fix``'s runs): ``apply_model`` on each model
  the hooks find (once it is ``ready``), ``apply_input`` at each top-level forward; its facts:
  ``model_facts``, ``input_facts``;
- profile's rules: ``PHASES`` bound its saving; the fresh runs that confirm a probe set ``KNOB``;
- profile's exit probe: ``applies``, then ``apply_model`` on a copy fed ``apply_input``, timed against the
  model as it ran (``ARMS``); ``RULE`` (with ``rule_fields``) makes the finding;
- ``pitstop fix``: ``cannot_help``; ``fix --apply``: ``edit``; a finding's code: ``SNIPPET``.

torch is imported inside the functions that touch tensors: the registry, which the CLI reads without
torch, takes its entry's texts from here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pitstop.recipes.component import MODEL, ProbeRule
from pitstop.recipes.editing import ScriptEditor
from pitstop.recipes.entries import entry

if TYPE_CHECKING:
    import torch

NAME = "channels_last"
KNOB = "channels_last"  # the ``Knobs`` field that turns it on (train, bench, profile's injection)
SURFACE = MODEL
FINDING = "memory_format.channels_last"
PROBE = "channels_last"
ARMS = ("nchw", "channels_last")
PHASES = ("forward_s", "backward_s")  # the parts of the step its saving lives in (rulekit's ceiling)
SNIPPET = "model = model.to(memory_format=torch.channels_last)\nx = x.to(memory_format=torch.channels_last)"
CONVERT = "{0}.to(memory_format=torch.channels_last)"  # what fix --apply assigns to the model and input

RULE = ProbeRule(
    NAME,
    title="The conv net runs in NCHW; channels_last is faster here",
    evidence="forward+backward on the script's last batch: NCHW {base}, channels_last {new} (medians, "
    "measured after the run); {conv2d_layers} Conv2d layers",
    fix="Convert the model and its image batches to channels_last once.",
    pass_title="channels_last measured to save under {bar} of the step for this model",
    pass_evidence="NCHW {base}, channels_last {new}",
    at_model=True,
)

# its registry entry: name, snippet, finding, knob and probe are the constants above
RECIPE = entry(
    __name__,
    title="channels_last",
    train="TrainConfig.channels_last",
    bench=(("channels_last", "channels_last"),),
    apply="pitstop.fix.apply.apply_component",
    site="model",
)


def _convs() -> tuple[type, ...]:
    import torch

    return (torch.nn.Conv2d, torch.nn.ConvTranspose2d)


def has_conv2d(model: torch.nn.Module) -> bool:
    """Whether the model has a 2-D (transposed) convolution, the layers NHWC speeds up."""
    convs = _convs()
    return any(isinstance(m, convs) for m in model.modules())


def wanted(setting: bool | str, model: torch.nn.Module) -> bool:
    """Whether ``pitstop.train`` converts ``model``: ``"auto"`` (``TrainConfig``'s default) for a conv net,
    on CUDA (NHWC tensor-core kernels) and on CPU (oneDNN's native layout); else the setting. On CPU it
    pays once freed memory stays mapped (keep_host_memory): without that, the extra NHWC copies add page
    faults that eat the gain (benchmarks/results/train_vs_peers.md)."""
    return has_conv2d(model) if setting == "auto" else bool(setting)


def ready(model: torch.nn.Module) -> bool:
    """Whether ``apply_model`` can convert ``model`` now: a lazy layer has no shape before its first
    forward, so profile's injection converts such a model after that forward."""
    import torch

    return not any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in model.parameters())


def apply_model(model: torch.nn.Module) -> torch.nn.Module:
    """4-D floating parameters and buffers to channels_last, in place; the rest as they are
    (``Module.to(memory_format=...)`` would also try 5-D ones, which channels_last cannot hold), lazy
    ones too (they have no shape before their first forward). The parameters stay the same objects, so
    an optimizer built before still holds them."""
    import torch
    from torch.nn.parameter import is_lazy

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if not is_lazy(t) and t.dim() == 4 and t.is_floating_point():
                t.data = t.data.contiguous(memory_format=torch.channels_last)
    return model


@functools.cache
def _nhwc_grad() -> Any:
    """An identity whose backward hands the incoming gradient on in channels_last (built on first use:
    this module imports torch lazily)."""
    import torch

    class NHWCGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad.contiguous(memory_format=torch.channels_last)

    return NHWCGrad


def _grad_nhwc_hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    import torch

    if torch.compiler.is_compiling():
        return None  # inductor picks the graph's layouts itself; the identity would break the graph
    x = args[0] if args else None
    if x is None or not _is_grad_nhwc_input(x):
        return None
    return (_nhwc_grad().apply(x), *args[1:])


def _is_grad_nhwc_input(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor) and x.dim() == 4 and x.requires_grad and _is_nhwc(x)


def keep_grad_nhwc(model: torch.nn.Module) -> list[Any]:
    """Keep the gradient in channels_last where a layout-blind backward would hand back NCHW: global
    average pooling (``AdaptiveAvgPool2d``) and ``Flatten(start_dim=1)`` of an NHWC activation. The
    elementwise backward before them (ReLU's, BatchNorm's) then mixes layouts and leaves its vectorized
    path (~10x slower on CPU for the benchmark net's last block). A forward pre-hook on each such module
    passes its NHWC input through an identity whose backward converts the gradient: one copy instead of
    a slow kernel, values unchanged. Measured on CPU (bf16, 1 thread): 1.03-1.05x a step with global
    pooling, 1.07x with a Flatten head (``benchmarks/results/train_levers.md``). The identity's output is
    a view of its input, so only modules whose output is a new tensor are hooked: pooling, and a Flatten
    from dim 1 (merging C with H and W of an NHWC tensor copies); a Flatten from dim 2 keeps a view,
    which an in-place op after it could not modify. Training only: ``pitstop.train.fit`` removes the
    hooks when it returns (``torch.jit.script``, ``deepcopy`` and export then see the model as it was);
    ``apply_model`` adds none. Under ``torch.compile`` the hooks do nothing: inductor picks the layouts of
    the graph itself, and the identity split the benchmark net into three graphs, which cost compile its
    saving (fp32: 1.13x eager with the hooks off under compile, 0.95-1.01x with them on;
    ``benchmarks/results/compile_auto.md``). Returns the handles of the hooks added (``remove()``; once
    per module, however often it is called)."""
    import torch

    def wants(m: torch.nn.Module) -> bool:
        flat = isinstance(m, torch.nn.Flatten) and m.start_dim == 1
        return (flat or isinstance(m, torch.nn.AdaptiveAvgPool2d)) and (
            _grad_nhwc_hook not in m._forward_pre_hooks.values()
        )

    return [m.register_forward_pre_hook(_grad_nhwc_hook) for m in model.modules() if wants(m)]


def train_model(model: torch.nn.Module) -> list[Any]:
    """``pitstop.train``'s addition to ``apply_model``: ``keep_grad_nhwc``; its hooks' handles."""
    return keep_grad_nhwc(model)


def apply_input(batch: Any) -> Any:
    """Every 4-D floating tensor in ``batch`` (tensor, tuple, named tuple, list or dict) in channels_last."""
    import torch

    def convert(b: Any) -> Any:
        if isinstance(b, torch.Tensor):
            if b.dim() == 4 and b.is_floating_point():
                return b.contiguous(memory_format=torch.channels_last)
            return b
        if isinstance(b, list | tuple):
            out = [convert(x) for x in b]
            return type(b)(*out) if hasattr(b, "_fields") else type(b)(out)
        if isinstance(b, dict):
            return {k: convert(v) for k, v in b.items()}
        return b

    return convert(batch)


def _is_nhwc(t: torch.Tensor) -> bool:
    import torch

    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def model_facts(model: torch.nn.Module) -> dict[str, Any]:
    """``channels_last``: the model has Conv2d layers and every one whose kernel is larger than 1x1
    holds its weight in channels_last (a 1x1 weight is contiguous in both formats)."""
    import torch

    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    big = [c for c in convs if c.weight.shape[-1] > 1 or c.weight.shape[-2] > 1]
    return {NAME: bool(convs) and all(_is_nhwc(c.weight) for c in big)}


def input_in_use(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether a forward's inputs include a 4-D tensor in channels_last."""
    return any(t.dim() == 4 and _is_nhwc(t) for t in tensors)


def input_facts(tensors: Sequence[torch.Tensor]) -> dict[str, Any]:
    """What profile records about a forward's inputs: ``input_channels_last``."""
    return {"input_" + NAME: input_in_use(tensors)}


def applies(facts: Mapping[str, Any]) -> bool:
    """A conv net still in NCHW: the probe has something to change."""
    return bool(facts.get("conv2d_layers")) and not facts.get(NAME)


def rule_fields(model: Mapping[str, Any], probe: Mapping[str, Any], device: str) -> dict[str, Any]:
    """The fields ``RULE``'s texts take beside the probe's: the model's Conv2d layers."""
    return {"conv2d_layers": model.get("conv2d_layers")}


def cannot_help(models: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the change has nothing to act on: every recorded model has no Conv2d layer and no 4-D input.
    None where nothing was recorded (the fix run still measures it)."""
    known = [md for md in models if "conv2d_layers" in md and "input_shapes" in md]
    if known and not any(
        md["conv2d_layers"] or any(len(sh) == 4 for sh in md["input_shapes"] or []) for md in known
    ):
        return "the model has no Conv2d layer and no 4-D input, so channels_last has nothing to change"
    return None


def edit(editor: ScriptEditor) -> dict[str, Any]:
    """The model converted after the line that assigns it, and its first input after the line that
    moves it with ``.to(...)`` (else before the forward's statement)."""
    editor.reassign_model(CONVERT.format)
    editor.reassign_input(CONVERT.format)
    editor.need_torch()
    return {NAME: True}
