"""Which number formats this machine's processors run fast (tensor cores, bf16 hardware), for `auto` AMP."""

from __future__ import annotations

from pitstop.host.cpu import cpu_has_fast_bf16


def device_type(device: object) -> str:
    """The device kind: ``cuda`` for "cuda", "cuda:1" or a CUDA torch.device, likewise cpu and mps;
    None or "" -> cpu."""
    return str(device or "cpu").split(":", 1)[0]


def gpu_has_tensor_cores(capability: tuple[int, int]) -> bool:
    """Volta (7.0) and later have tensor cores for fp16; Ampere (8.0) and later also for bf16/tf32."""
    return capability >= (7, 0)


def gpu_supports_bf16(capability: tuple[int, int]) -> bool:
    return capability >= (8, 0)


def preferred_amp_dtype(device_type: str, flags: frozenset[str] | None = None) -> str | None:
    """'bfloat16', 'float16' or None (stay fp32) for this hardware. Import torch only when asked about CUDA."""
    if device_type == "cpu":
        return "bfloat16" if cpu_has_fast_bf16(flags) else None
    if device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            return None
        cap = torch.cuda.get_device_capability()
        if gpu_supports_bf16(cap):
            return "bfloat16"
        return "float16" if gpu_has_tensor_cores(cap) else None
    return None
