"""What a compression report compares: the methods by kind, the report's options, and one ``Row`` of
measurements per method. Shared by ``report`` (which measures the rows) and ``report_findings`` (which
judges them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DISTILL_METHODS = ("student", "distill")
QUANT_METHODS = ("dynamic_int8", "static_int8", "int8_weight_only")
PRUNE_METHODS = ("prune_global", "prune_structured")
ALL_METHODS = (*QUANT_METHODS, *PRUNE_METHODS, *DISTILL_METHODS)
# int8_weight_only (torchao) runs in eager as a tensor subclass: slow on CPU without torch.compile, so it
# is opt-in; student/distill need a student model and training data.
DEFAULT_METHODS = ("dynamic_int8", "static_int8", "prune_global", "prune_structured")


@dataclass
class ReportOptions:
    methods: Sequence[str] = DEFAULT_METHODS
    prune_amount: float = 0.5
    structured_amount: float = 0.3
    remove_channels: bool = True  # structured: delete zeroed channels where exact (pitstop.compress.shrink)
    finetune_steps: int = 100
    lr: float = 1e-3
    distill_steps: int = 200
    temperature: float = 4.0
    alpha: float = 0.9
    calib_batches: int = 8
    eval_batches: int | None = None
    batch_n: int | None = None  # rows of the first eval batch when None
    threads: int | None = None
    min_run_time: float = 0.5  # seconds of timing per model and batch size, over all rounds
    latency_rounds: int = 3
    max_acc_drop: float = 0.01  # accuracy loss (fraction) still counted as "kept"
    seed: int = 0


@dataclass
class Row:
    """One line of the comparison table. ``applicable`` False: ``reason`` says why; ``error``: it failed."""

    method: str
    applicable: bool = True
    reason: str = ""
    error: str = ""
    library: str = ""
    params: int | None = None
    nonzero_params: int | None = None
    size_bytes: int | None = None
    gzip_bytes: int | None = None
    latency_b1_s: float | None = None
    latency_bn_s: float | None = None
    batch_n: int | None = None
    accuracy: float | None = None
    eval_samples: int = 0
    weight_sparsity: float | None = None
    apply_s: float | None = None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
