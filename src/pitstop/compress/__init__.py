"""pitstop.compress: quantization, pruning and distillation, each measured against the baseline.

Common case::

    from pitstop.compress import quantize, prune, distill
    qmodel = quantize(model, method="dynamic_int8")             # Linear/LSTM weights to int8
    qconv = quantize(cnn, method="static_int8", calib_loader=loader)  # conv nets, x86 oneDNN int8
    pmodel = prune(model, amount=0.5, finetune_loader=train_loader, finetune_steps=100)
    distill(teacher, student, train_loader, T=4.0, alpha=0.9, steps=500)

``compress_report`` (and ``pitstop compress report``) measures all of them side by side.
Importing this package does not import torch; using a name from it does.
"""

from __future__ import annotations

import importlib
from typing import Any

# Names resolve on first use (PEP 562) so that importing ``pitstop.compress.cli`` for ``pitstop --help``
# does not import torch.
_WHERE = {
    "distill": "distillation",
    "distillation_loss": "distillation",
    "accuracy": "measure",
    "latency": "measure",
    "param_count": "measure",
    "serialized_size": "measure",
    "sparsity": "measure",
    "prune": "pruning",
    "prune_detailed": "pruning",
    "METHODS": "quantization",
    "NotApplicable": "quantization",
    "quantize": "quantization",
    "quantize_detailed": "quantization",
    "ALL_METHODS": "table",
    "DEFAULT_METHODS": "table",
    "ReportOptions": "table",
    "Row": "table",
    "compress_report": "report",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"pitstop.compress.{_WHERE[name]}"), name)
    if name == "digits":
        return importlib.import_module("pitstop.compress.digits")
    raise AttributeError(f"module 'pitstop.compress' has no attribute {name!r}")


__all__ = [
    "ALL_METHODS",
    "DEFAULT_METHODS",
    "METHODS",
    "NotApplicable",
    "ReportOptions",
    "Row",
    "accuracy",
    "compress_report",
    "distill",
    "distillation_loss",
    "latency",
    "param_count",
    "prune",
    "prune_detailed",
    "quantize",
    "quantize_detailed",
    "serialized_size",
    "sparsity",
]
