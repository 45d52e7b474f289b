"""A short description of the machine a measurement ran on, for report headers and benchmark results."""

from __future__ import annotations

import os
import platform
from typing import Any

import psutil

from pitstop.host.cpu import cpu_model, usable_cores
from pitstop.units import GiB


def describe_machine() -> dict[str, Any]:
    """CPU, cores, RAM, torch build and GPU (if any). Imports torch: call it where torch is loaded anyway."""
    import torch

    d: dict[str, Any] = {
        "cpu": cpu_model(),
        "usable_cores": usable_cores(),
        "logical_cpus": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / GiB, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda_build": torch.version.cuda,
        "gpu": None,
    }
    if torch.cuda.is_available():
        d["gpu"] = f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return d


def machine_line() -> str:
    d = describe_machine()
    gpu = d["gpu"] or "no GPU"
    return (
        f"{d['cpu']}, {d['usable_cores']} usable cores, {d['ram_gib']} GiB RAM, {gpu}; "
        f"Python {d['python']}, torch {d['torch']} ({d['torch_threads']} threads)"
    )
