"""Fakes shared by the doctor tests: a pynvml stand-in driven by a dict per GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 4: "Insufficient Permissions", 9: "Driver Not Loaded"}.get(
            self.value, f"NVML error {self.value}"
        )


A100 = {
    "name": "NVIDIA A100-SXM4-40GB",
    "uuid": "GPU-1234",
    "mem_total": 40 * 2**30,
    "mem_used": 3 * 2**30,
    "cc": (8, 0),
    "ecc": [1, 1],
    "persistence": 1,
    "pcie_gen": 4,
    "pcie_gen_max": 4,
    "pcie_width": 16,
    "pcie_width_max": 16,
    "max_clock": {1: 1410, 2: 1215},
    "clock": {1: 1095, 2: 1215},
    "power_limit_mw": 400000,
    "power_mw": 61000,
    "temp": 34,
    "util": (87, 40),
    "pids": [4242],
    "reasons": 0x1,  # gpu_idle
}


@dataclass
class FakeNvmlLib:
    """Behaves like the parts of pynvml that pitstop.host.nvml calls. ``unsupported``: function names that
    answer NOT_SUPPORTED; ``init_error``: an NVML code nvmlInit fails with."""

    gpus: list[dict[str, Any]] = field(default_factory=lambda: [dict(A100)])
    driver: str = "550.54.15"
    cuda_driver: int = 12040
    unsupported: set[str] = field(default_factory=set)
    init_error: int | None = None
    inits: int = 0
    shutdowns: int = 0

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    def _check(self, name: str) -> None:
        if name in self.unsupported:
            raise FakeNVMLError(3)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        if i >= len(self.gpus):
            raise FakeNVMLError(2)
        return self.gpus[i]

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_driver

    def __getattr__(self, name: str) -> Any:
        # per-device getters, generated from the dict keys
        table = {
            "nvmlDeviceGetName": lambda h: h["name"].encode(),  # old pynvml returns bytes
            "nvmlDeviceGetUUID": lambda h: h["uuid"],
            "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(
                total=h["mem_total"], used=h["mem_used"], free=h["mem_total"] - h["mem_used"]
            ),
            "nvmlDeviceGetCudaComputeCapability": lambda h: h["cc"],
            "nvmlDeviceGetEccMode": lambda h: h["ecc"],
            "nvmlDeviceGetPersistenceMode": lambda h: h["persistence"],
            "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: h["pcie_gen"],
            "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: h["pcie_gen_max"],
            "nvmlDeviceGetCurrPcieLinkWidth": lambda h: h["pcie_width"],
            "nvmlDeviceGetMaxPcieLinkWidth": lambda h: h["pcie_width_max"],
            "nvmlDeviceGetMaxClockInfo": lambda h, t: h["max_clock"][t],
            "nvmlDeviceGetClockInfo": lambda h, t: h["clock"][t],
            "nvmlDeviceGetEnforcedPowerLimit": lambda h: h["power_limit_mw"],
            "nvmlDeviceGetPowerManagementLimit": lambda h: h["power_limit_mw"],
            "nvmlDeviceGetPowerManagementDefaultLimit": lambda h: h.get("power_default_mw", 400000),
            "nvmlDeviceGetPowerUsage": lambda h: h["power_mw"],
            "nvmlDeviceGetTemperature": lambda h, s: h["temp"],
            "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=h["util"][0], memory=h["util"][1]),
            "nvmlDeviceGetComputeRunningProcesses": lambda h: [SimpleNamespace(pid=p) for p in h["pids"]],
            "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
            "nvmlDeviceGetCurrentClocksEventReasons": lambda h: h["reasons"],
        }
        if name not in table:
            raise AttributeError(name)
        fn = table[name]

        def call(*args: Any) -> Any:
            self._check(name)
            return fn(*args)

        return call


@pytest.fixture
def fake_nvml() -> FakeNvmlLib:
    return FakeNvmlLib()


def write_tree(root, files: dict[str, str]) -> None:
    """Create files (and their folders) under root: {"sys/block/sda/queue/rotational": "1"}."""
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


@pytest.fixture
def tree():
    return write_tree


def make_build(**kw: Any):
    """A TorchBuild as a CUDA 12.4 wheel on a machine with one A100 would report; override any field."""
    from pitstop.doctor.torchinfo import TorchBuild

    base = dict(
        version="2.5.1+cu124",
        cuda="12.4",
        build_type="Release",
        cuda_available=True,
        device_count=1,
        devices=[("NVIDIA A100-SXM4-40GB", (8, 0))],
        arch_list=["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
        cudnn_available=True,
        cudnn_version=90100,
        nccl_version=(2, 21, 5),
        cpu_capability="AVX512",
        mkldnn=True,
        mkldnn_version="3.5.3",
        openmp=True,
        mkl=True,
        parallel_backend="OpenMP",
        num_threads=8,
        num_interop_threads=8,
        torchvision_version="0.20.1+cu124",
    )
    base.update(kw)
    return TorchBuild(**base)


@pytest.fixture
def build_factory():
    return make_build
