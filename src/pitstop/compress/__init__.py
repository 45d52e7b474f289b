"""pitstop.compress: quantization, pruning and distillation, each measured against the baseline.

Common case::

    from pitstop.compress import quantize, prune, distill
    qmodel = quantize(model, method="dynamic_int8")             # Linear/LSTM weights to int8
    qconv = quantize(cnn, method="static_int8", calib_loader=loader)  # conv nets, x86 oneDNN int8
    pmodel = prune(model, amount=0.5, finetune_loader=train_loader, finetune_steps=100)
    distill(teacher, student, train_loader, T=4.0, alpha=0.9, steps=500)

``compress_report`` (and ``pitstop compress report``) measures all of them side by side.
Importing this package imports torch.
"""

from pitstop.compress.distill import distill, distillation_loss
from pitstop.compress.measure import accuracy, latency, param_count, serialized_size, sparsity
from pitstop.compress.prune import prune, prune_detailed
from pitstop.compress.quantize import METHODS, NotApplicable, quantize, quantize_detailed
from pitstop.compress.report import ALL_METHODS, DEFAULT_METHODS, ReportOptions, Row, compress_report

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
