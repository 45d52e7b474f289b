"""Post-training int8 quantization, on the library that works best for each method on torch 2.14.

- ``dynamic_int8``: ``torch.ao.quantization.quantize_dynamic`` (Linear/LSTM/GRU weights int8, activations
  quantized per batch at run time). Deprecated in favour of torchao, but on CPU it is still the only
  eager path with fused int8 kernels (fbgemm/x86); torchao's eager tensor-subclass path measured
  several times slower than fp32 here without ``torch.compile``. Falls back to torchao when torch.ao is
  gone.
- ``static_int8``: PT2E with torchao's ``X86InductorQuantizer``: export, calibrate on a few batches,
  convert, then lower to oneDNN int8 conv/linear kernels (the freezing passes inductor runs), keeping
  the batch dimension dynamic. For conv nets on x86.
- ``int8_weight_only``: torchao ``Int8WeightOnlyConfig`` (weights int8, compute in float). Meant for
  GPUs and ``torch.compile``; in eager on CPU it shrinks the model but is slow.

See docs/compress.md for the measurements behind these choices.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pitstop.compress.measure import as_args, split_batch

METHODS = ("dynamic_int8", "static_int8", "int8_weight_only")
DYNAMIC_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, nn.RNNCell)
STATIC_TYPES: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Linear)


class NotApplicable(ValueError):
    """The method does not apply to this model (the message says why)."""


@dataclass
class Quantized:
    """A quantized model, and the module whose state_dict is the artifact a user would save.

    They differ for ``static_int8``: the model that runs holds oneDNN-packed weights (opaque, not
    serializable); the portable form is the converted graph with int8 weights, before lowering.
    """

    model: nn.Module
    portable: nn.Module
    method: str
    library: str
    quantized_layers: int
    notes: str = ""


def _require_torchao(method: str) -> None:
    """torchao is an optional dependency (``pip install 'pitstop[compress]'``): without it, say so."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        raise NotApplicable(
            f"{method} needs torchao, which is not installed (pip install 'pitstop[compress]')"
        )


def count_layers(model: nn.Module, types: tuple[type[nn.Module], ...]) -> int:
    return sum(isinstance(m, types) for m in model.modules())


def quantize(
    model: nn.Module,
    method: str = "dynamic_int8",
    calib_loader: Iterable[Any] | None = None,
    calib_batches: int = 8,
) -> nn.Module:
    """Return an int8 copy of ``model`` (the input is left unchanged); see ``quantize_detailed``."""
    return quantize_detailed(model, method, calib_loader, calib_batches).model


def quantize_detailed(
    model: nn.Module,
    method: str = "dynamic_int8",
    calib_loader: Iterable[Any] | None = None,
    calib_batches: int = 8,
) -> Quantized:
    """Quantize a copy of ``model`` with ``method`` (one of ``METHODS``); raises ``NotApplicable``.

    ``static_int8`` needs ``calib_loader`` (batches like the eval data); its first batch is also the
    example input for export.
    """
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; choose from {', '.join(METHODS)}")
    model = copy.deepcopy(model).eval().cpu()
    if method == "dynamic_int8":
        return _dynamic_int8(model)
    if method == "static_int8":
        if calib_loader is None:
            raise NotApplicable("static int8 needs calibration data (calib_loader)")
        return _static_int8(model, calib_loader, calib_batches)
    return _int8_weight_only(model)


def _dynamic_int8(model: nn.Module) -> Quantized:
    n = count_layers(model, DYNAMIC_TYPES)
    if n == 0:
        kinds = sorted({type(m).__name__ for m in model.modules() if not list(m.children())})
        raise NotApplicable(
            "dynamic int8 quantizes Linear/LSTM/GRU layers and the model has none "
            f"(layers: {', '.join(kinds[:6]) or 'none'}); use static_int8 for conv nets"
        )
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError:  # torch.ao.quantization removed: torchao's eager API (Linear only)
        return _dynamic_int8_torchao(model)
    with warnings.catch_warnings():
        # torch 2.14 marks torch.ao.quantization deprecated; the kernels it uses are still the fast
        # eager CPU path. The choice is explained in docs/compress.md, not repeated on every call.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
        warnings.filterwarnings("ignore", message=".*deprecated.*")
        q = quantize_dynamic(model, set(DYNAMIC_TYPES), dtype=torch.qint8)
    return Quantized(q, q, "dynamic_int8", "torch.ao.quantization", n)


def _dynamic_int8_torchao(model: nn.Module) -> Quantized:
    n = count_layers(model, (nn.Linear,))
    if n == 0:
        raise NotApplicable(
            "torch.ao.quantization is not available and torchao's dynamic int8 covers Linear only"
        )
    _require_torchao("dynamic_int8 without torch.ao.quantization")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    return Quantized(
        model, model, "dynamic_int8", "torchao", n, "eager tensor subclass; fast with torch.compile"
    )


def _int8_weight_only(model: nn.Module) -> Quantized:
    n = count_layers(model, (nn.Linear,))
    if n == 0:
        raise NotApplicable("torchao int8 weight-only quantizes Linear layers and the model has none")
    _require_torchao("int8_weight_only")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model, Int8WeightOnlyConfig())
    return Quantized(
        model, model, "int8_weight_only", "torchao", n, "eager tensor subclass; fast with torch.compile"
    )


def _export_inputs(calib_loader: Iterable[Any]) -> tuple[Any, ...]:
    for batch in calib_loader:
        x, _ = split_batch(batch)
        args = as_args(x)
        if not all(isinstance(a, torch.Tensor) for a in args):
            raise NotApplicable("static int8 export needs tensor inputs")
        if args[0].shape[0] < 2:
            raise NotApplicable(
                "static int8 needs a calibration batch of at least 2 rows (batch dim is exported dynamic)"
            )
        return tuple(a.cpu() for a in args)
    raise NotApplicable("the calibration data is empty")


def _unshare_module_calls(gm: torch.fx.GraphModule) -> None:
    """Give each call of a module used twice (torchvision ResNet's ``relu``) its own source partition.

    The x86 quantizer groups nodes by the module that made them; a reused ReLU then looks like one
    partition with two outputs and annotation fails. export already numbers repeated calls
    (``layer1.0.relu@1``); carry that number into the name the partitioner groups by.
    """
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            continue
        key = next(reversed(stack))
        if "@" in key:
            fqn, cls = stack[key]
            stack[key] = (f"{fqn}@{key.rsplit('@', 1)[1]}", cls)


def _drop_unused_attrs(gm: torch.fx.GraphModule) -> None:
    """After convert, the fp32 weights stay attached though the graph reads only their int8 copies."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in [*gm.named_parameters(), *gm.named_buffers()]:
        if name not in used:
            owner, _, leaf = name.rpartition(".")
            delattr(gm.get_submodule(owner) if owner else gm, leaf)


def _lower_x86(gm: torch.fx.GraphModule, example: tuple[Any, ...], dynamic: Any) -> torch.fx.GraphModule:
    """torchao's ``lower_pt2e_quantized_to_x86`` with a dynamic batch dimension.

    Same passes (re-export, CIA-only decompositions, inductor freezing patterns that fuse
    dequant-conv-quant into oneDNN int8 ops, constant folding) plus view->reshape: the fused ops may
    return channels-last outputs that a later ``view`` cannot take.
    """
    from torch._inductor.constant_folding import constant_fold
    from torch._inductor.fx_passes.freezing_patterns import freezing_passes

    table = torch.export.default_decompositions()
    for op in list(table):
        if not torch._export.utils._is_cia_op(op):
            del table[op]
    lowered = torch.export.export(gm, example, dynamic_shapes=dynamic, strict=True).run_decompositions(table)
    lm = lowered.module()
    aten = torch.ops.aten
    for node in list(lm.graph.nodes):
        if node.target == aten.t.default:
            with lm.graph.inserting_before(node):
                perm = lm.graph.call_function(aten.permute.default, args=(node.args[0], [1, 0]))
            node.replace_all_uses_with(perm)
            lm.graph.erase_node(node)
        elif node.target == aten.view.default:
            node.target = aten.reshape.default
    lm.graph.lint()
    lm.recompile()
    freezing_passes(lm, example)
    constant_fold(lm)
    return lm


def _static_int8(model: nn.Module, calib_loader: Iterable[Any], calib_batches: int) -> Quantized:
    n = count_layers(model, STATIC_TYPES)
    if n == 0:
        raise NotApplicable("static int8 quantizes Conv/Linear layers and the model has none")
    if "x86" not in torch.backends.quantized.supported_engines:
        raise NotApplicable("static int8 here targets x86 oneDNN kernels; this CPU has no x86 engine")
    _require_torchao("static_int8 (PT2E)")
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e import allow_exported_model_train_eval, move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    example = _export_inputs(calib_loader)
    dynamic = tuple({0: torch.export.Dim.AUTO} for _ in example)
    try:
        gm = torch.export.export(model, example, dynamic_shapes=dynamic).module()
    except Exception as e:  # export failures are model-specific (data-dependent control flow, ...)
        raise NotApplicable(
            f"torch.export could not capture the model: {type(e).__name__}: {_first_line(e)}"
        ) from e
    _unshare_module_calls(gm)
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = move_exported_model_to_eval(prepare_pt2e(gm, quantizer))
        with torch.no_grad():
            for i, batch in enumerate(calib_loader):
                if i >= calib_batches:
                    break
                x, _ = split_batch(batch)
                prepared(*(a.cpu() for a in as_args(x)))
        converted = convert_pt2e(prepared)
        _drop_unused_attrs(converted)
        notes = ""
        with torch.no_grad():
            try:
                lowered = _lower_x86(converted, example, dynamic)
                lowered(*example)  # fused kernels have layout rules of their own: check they run
                library = "torchao PT2E (X86InductorQuantizer), oneDNN int8 kernels"
            except Exception as e:  # keep the correct int8 model, in its slower reference form
                lowered = converted
                library = "torchao PT2E (X86InductorQuantizer), reference int8 (not lowered)"
                notes = f"lowering to oneDNN failed ({type(e).__name__}: {_first_line(e)}); q/dq reference ops run"
        # eval()/train() on exported modules raise unless allowed; both are inference-only from here
        allow_exported_model_train_eval(converted)
        if lowered is not converted:
            allow_exported_model_train_eval(lowered)
    return Quantized(lowered, converted, "static_int8", library, n, notes)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""
