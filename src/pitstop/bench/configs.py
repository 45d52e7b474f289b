"""The ablation: a baseline, each optimization alone, all together, and the tuning guides' claims.

A BenchConfig is plain data; ``why_not(config, device)`` says why a config cannot run here (fp16 without a
GPU, pinned memory without CUDA), so its row carries a reason instead of a number.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pitstop.recipes import bench_title, channels_last, enabled, tf32
from pitstop.recipes import compile as torch_compile
from pitstop.recipes.knobs import Knobs


@dataclass(frozen=True)
class Claim:
    """What tuning guides promise, as a range of a ratio against the baseline."""

    text: str
    # "speedup" (throughput ratio), "memory" (peak step memory ratio), "activations" (activation memory
    # ratio), "steps" (steps-to-target ratio), "efficiency" (DDP speed-up / processes)
    metric: str
    low: float | None = None  # the claimed ratio range, when the claim is numeric
    high: float | None = None


@dataclass(frozen=True)
class BenchConfig(Knobs):
    """One row of the ablation: the optimization settings it turns on (``Knobs``: ``dataloader``
    workers and pinning, ``channels_last``, ``autocast``, ``optimizer_impl``, ``compile``, ``tf32``) and
    the ones only a bench row has."""

    name: str
    title: str
    checkpoint: bool = False
    accumulation: int = 1  # micro-batches per optimizer step, at the same effective batch
    peer: str | None = None  # "lightning" / "accelerate": the same baseline step through that library
    claim: Claim | None = None
    isolate: bool = False  # measured in a subprocess with a timeout (compile can take minutes)

    @property
    def amp(self) -> str | None:
        """The autocast dtype ("bfloat16" / "float16"), None for fp32."""
        return self.autocast

    @property
    def fused(self) -> bool:
        return self.optimizer_impl == "fused"

    def knobs(self) -> str:
        """The settings that differ from the baseline, in words."""
        parts = []
        if self.num_workers:
            parts.append(f"num_workers={self.num_workers}")
        if self.pin_memory:
            parts.append("pin_memory")
        parts += [c.NAME for c in enabled(self)]
        if self.tf32:
            parts.append("TF32 matmuls")
        if self.autocast:
            parts.append(f"autocast {self.autocast}")
        if getattr(self, torch_compile.KNOB):
            parts.append(bench_title(torch_compile.NAME))
        if self.fused:
            parts.append("fused AdamW")
        if self.checkpoint:
            parts.append("activation checkpointing")
        if self.accumulation > 1:
            parts.append(f"{self.accumulation} micro-batches accumulated")
        if self.peer:
            parts.append(f"via {self.peer}")
        return ", ".join(parts) or "fp32, num_workers=0, foreach AdamW"


CLAIMS = {
    "workers": Claim("workers + pinned memory cut data-loading time to 1/3-1/2", "speedup", 1.5, 3.0),
    "pin_memory": Claim("pinned memory speeds host-to-GPU copies", "speedup", 1.1, 2.0),
    channels_last.NAME: Claim("channels_last speeds convolutions 8-35% (with AMP)", "speedup", 1.08, 1.35),
    "amp_bf16": Claim("AMP 2-3x faster, 30-50% less memory", "speedup", 2.0, 3.0),
    "amp_fp16": Claim("AMP 2-3x faster, 30-50% less memory", "speedup", 2.0, 3.0),
    torch_compile.NAME: Claim("torch.compile 1.3-2x faster training", "speedup", 1.3, 2.0),
    # the tensor-core rate is several times fp32's; a whole step gains what its matmuls take
    tf32.NAME: Claim("TF32 tensor cores run fp32 matmuls several times faster (Ampere+)", "speedup"),
    "fused": Claim("fused optimizer: fewer kernels, faster optimizer step", "speedup", 1.0, 1.2),
    "checkpoint": Claim("activation checkpointing about halves activation memory", "activations", 0.4, 0.6),
    # At equal effective batch, 4 accumulated micro-batches should hold about 1/4 of the activations.
    "accumulation": Claim(
        "gradient accumulation emulates a 4x batch at no memory cost", "activations", 0.2, 0.35
    ),
    "all": Claim("all speed optimizations together", "speedup", None, None),
    "lightning": Claim("a framework adds little overhead over plain PyTorch", "speedup", 0.95, 1.05),
    "accelerate": Claim("a framework adds little overhead over plain PyTorch", "speedup", 0.95, 1.05),
    "onecycle": Claim("OneCycle shortens time-to-accuracy 30-50%", "steps", 0.5, 0.7),
    "ddp": Claim("DDP on 8 GPUs 7-8x (scaling efficiency 88-100%)", "efficiency", 0.875, 1.0),
}

# Second claims some rows carry (AMP promises speed and memory); reported as their own findings.
MEMORY_CLAIMS = {
    "amp_bf16": Claim("AMP 30-50% less memory", "activations", 0.5, 0.7),
    "amp_fp16": Claim("AMP 30-50% less memory", "activations", 0.5, 0.7),
}

BASELINE = BenchConfig("baseline", "baseline")


def _single(row: str, **knobs: Any) -> BenchConfig:
    """The row that ablates one optimization: its name and title from the recipes registry."""
    return BenchConfig(row, bench_title(row), claim=CLAIMS[row], **knobs)


def _loader(workers: int, pin: bool) -> dict[str, Any]:
    return {"num_workers": workers, "pin_memory": pin}


def ablation(
    device: str, image_input: bool, amp_dtype: str | None, workers: int = 2, peers: bool = True
) -> list[BenchConfig]:
    """Baseline, each optimization alone, all speed optimizations together, and the peer rows."""
    configs = [
        BASELINE,
        _single("workers", dataloader=_loader(workers, device == "cuda")),
        _single("pin_memory", dataloader={"pin_memory": True}),
    ]
    if image_input:
        configs.append(_single(channels_last.NAME, **{channels_last.KNOB: True}))
    if device == "cuda":  # TF32 is a CUDA mode: no row elsewhere
        configs.append(_single(tf32.NAME, **{tf32.KNOB: True}))
    configs += [
        _single("amp_bf16", autocast="bfloat16"),
        _single("amp_fp16", autocast="float16"),
        _single("fused", optimizer_impl="fused"),
        _single("checkpoint", checkpoint=True),
        _single("accumulation", accumulation=4),
    ]
    speed = replace(
        BASELINE,
        dataloader=_loader(workers, device == "cuda"),
        optimizer_impl="fused",
        autocast=amp_dtype,
        **{channels_last.KNOB: image_input},
    )
    configs.append(replace(speed, name="all", title="all (eager)", claim=CLAIMS["all"]))
    if peers:
        configs += [
            BenchConfig("lightning", "Lightning Trainer", peer="lightning", claim=CLAIMS["lightning"]),
            BenchConfig("accelerate", "Accelerate", peer="accelerate", claim=CLAIMS["accelerate"]),
        ]
    configs += [
        # compiling can take minutes: these rows run in a subprocess with a timeout
        _single(torch_compile.NAME, **{torch_compile.KNOB: True}, isolate=True),
        replace(
            speed,
            name="all_compiled",
            title="all + compile",
            claim=CLAIMS["all"],
            isolate=True,
            **{torch_compile.KNOB: True},
        ),
    ]
    return configs


def why_not(config: BenchConfig, device: str, cuda_available: bool, bf16_ok: bool = True) -> str | None:
    """Why this config cannot run on this machine, or None when it can."""
    if config.pin_memory and not cuda_available and config.name == "pin_memory":
        return "no CUDA device: pinned memory only speeds host-to-GPU copies"
    if config.amp == "float16" and device != "cuda":
        return "no CUDA device: fp16 autocast with GradScaler needs a GPU (CPU autocast uses bf16)"
    if config.tf32 and device != "cuda":
        return "no CUDA device: TF32 is a mode of NVIDIA tensor cores"
    if config.amp == "bfloat16" and device == "cuda" and not bf16_ok:
        return "this GPU has no bf16 support (needs compute capability 8.0+)"
    return None


def effective(config: BenchConfig, device: str, cuda_available: bool) -> BenchConfig:
    """The config as it will run: pinning dropped where it cannot apply (the 'workers' row on CPU)."""
    if config.pin_memory and not cuda_available and config.name != "pin_memory":
        return replace(config, dataloader={**config.dataloader, "pin_memory": False})
    return config
