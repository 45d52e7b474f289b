"""Facts about the user's model, optimizers, torch settings and GPU, read in the child process.

What the rules need to know besides timings: dtypes, memory format, compile, DataParallel, which optimizer
implementation actually ran, cudnn/TF32 settings, and NVML utilization sampled in a thread.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

import torch

from pitstop.recipes import components, model_components
from pitstop.recipes.component import WRAP

clock = time.perf_counter


def model_facts(module: torch.nn.Module) -> dict[str, Any]:
    params = list(module.parameters())
    convs = [m for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
    inner = getattr(module, "_orig_mod", module)
    return {
        "type": type(inner).__name__,
        "params": sum(p.numel() for p in params),
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
        "param_dtypes": sorted({str(p.dtype).replace("torch.", "") for p in params}),
        "device": str(params[0].device) if params else None,
        "conv2d_layers": len(convs),
        **{k: v for c in model_components() for k, v in c.model_facts(module).items()},
        **{k: v for c in components(WRAP) for k, v in c.model_facts(module).items()},  # compiled
        "dataparallel": isinstance(module, torch.nn.DataParallel),
        "ddp": isinstance(module, torch.nn.parallel.DistributedDataParallel),
        "training": module.training,
    }


def torch_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "version": torch.__version__,
        "num_threads": torch.get_num_threads(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_available": torch.cuda.is_available(),
    }
    with contextlib.suppress(Exception):
        facts["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
        facts["tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
    # only if the script loaded dynamo (torch.compile): importing it takes seconds
    if "torch._dynamo" in sys.modules:
        with contextlib.suppress(Exception):
            from torch._dynamo.utils import counters

            facts["dynamo_graphs"] = int(counters["stats"].get("unique_graphs", 0))
    return facts


def finish_optimizer_facts(optimizers: list[torch.optim.Optimizer], facts_list: list[dict[str, Any]]) -> None:
    """Which implementation each optimizer actually ran (foreach/fused/for-loop), from its params' device."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    for opt, facts in zip(optimizers, facts_list, strict=False):
        groups = opt.param_groups
        if any(g.get("fused") for g in groups):
            facts["impl"] = "fused"
        elif any(g.get("foreach") for g in groups):
            facts["impl"] = "foreach"
        elif not facts["supports_foreach"]:
            facts["impl"] = "n/a"
        elif all(g.get("foreach") is None and not g.get("differentiable") for g in groups):
            params = [p for g in groups for p in g["params"]]
            try:
                _, foreach = _default_to_fused_or_foreach(params, differentiable=False)
            except Exception:
                foreach = False
            facts["impl"] = "foreach" if foreach else "for-loop"
        else:
            facts["impl"] = "for-loop"
        facts["params"] = sum(len(g["params"]) for g in groups)


class GpuSampler:
    """NVML utilization of the training GPU, sampled every 100 ms in a thread (no CUDA calls, no syncs)."""

    def __init__(self, index: int, t0: float) -> None:
        self.index = index
        self.t0 = t0
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="pitstop-gpu-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        from pitstop.host.nvml import Nvml, NvmlUnavailable

        try:
            with Nvml() as nv:
                while not self._stop.wait(0.1):
                    util = nv.sample(self.index).util_gpu_pct
                    if util is not None:
                        self.samples.append((clock(), float(util)))
        except NvmlUnavailable as e:
            self.error = e.reason
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)

    def summary(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Mean utilization over the measured steps (all samples when no step was measured)."""
        measured = [r for r in records if not r["warmup"]]
        vals = [u for _, u in self.samples]
        window = "whole run"
        if measured:
            lo = self.t0 + measured[0]["start_s"]
            hi = self.t0 + measured[-1]["start_s"] + measured[-1]["total_s"]
            inside = [u for t, u in self.samples if lo <= t <= hi]
            if inside:
                vals, window = inside, "measured steps"
        return {
            "index": self.index,
            "error": self.error,
            "samples": len(vals),
            "window": window,
            "mean_util_pct": sum(vals) / len(vals) if vals else None,
        }
