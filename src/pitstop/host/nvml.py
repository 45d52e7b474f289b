"""One place for NVML (the NVIDIA Management Library, via nvidia-ml-py's ``pynvml``).

``pynvml`` is imported lazily, on entering ``Nvml``. An absent module, shared library or driver raises
``NvmlUnavailable(reason)``, never an ImportError or a crash; callers turn that into a finding.
Every per-field query that NVML answers with "not supported" / "no permission" (and the like) gives None,
so one missing counter never hides the others. Tests pass a fake module as ``lib``.

    with Nvml() as nv:
        for i in range(nv.device_count()):
            print(nv.info(i), nv.sample(i))
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

# NVML return codes that mean "this field is not available here", not "NVML is broken".
# Numbers are NVML's (nvml.h); looked up on the module first so a fake module can use its own.
_SOFT_ERRORS = {
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,  # older driver without this entry point
    "NVML_ERROR_NO_DATA": 21,
}
_CLOCK_SM, _CLOCK_MEM, _TEMPERATURE_GPU = 1, 2, 0
# nvmlClocksEventReason* bits (nvml.h): why the GPU runs below its max clocks.
CLOCK_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used: no pynvml, no libnvidia-ml, no driver, no such GPU, or a hard NVML error."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class GpuInfo:
    """Static facts about one GPU. Each field is None where NVML says it is not supported or not allowed."""

    index: int
    name: str | None
    uuid: str | None
    memory_total_bytes: int | None
    driver_version: str | None
    cuda_driver_version: str | None  # highest CUDA the driver supports, e.g. "12.4"
    compute_capability: tuple[int, int] | None
    ecc_enabled: bool | None
    persistence_mode: bool | None
    pcie_gen: int | None
    pcie_gen_max: int | None
    pcie_width: int | None
    pcie_width_max: int | None
    sm_clock_max_mhz: int | None
    mem_clock_max_mhz: int | None
    power_limit_w: float | None
    power_limit_default_w: float | None = None  # the board's default; below it an admin capped the power


@dataclass
class GpuSample:
    """One reading of a GPU's counters."""

    index: int
    util_gpu_pct: float | None
    util_mem_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_w: float | None
    temperature_c: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    processes: list[int] | None  # pids of compute and graphics processes on this GPU
    # why clocks are below max right now ("gpu_idle", "sw_power_cap", "hw_thermal_slowdown" ...); [] none
    clock_reasons: list[str] | None = None


def format_cuda_version(value: int) -> str:
    """NVML/CUDA integer version 12040 -> "12.4"."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Nvml:
    """Context manager around an initialised NVML: nvmlInit on enter, nvmlShutdown on exit."""

    def __init__(self, lib: ModuleType | Any | None = None) -> None:
        self._lib = lib
        self._active = False
        self._handles: dict[int, Any] = {}

    # -- lifecycle -----------------------------------------------------------------------------------
    def __enter__(self) -> Nvml:
        if self._lib is None:
            try:
                self._lib = importlib.import_module("pynvml")
            except ImportError as e:
                raise NvmlUnavailable(f"pynvml (nvidia-ml-py) is not installed: {e}") from e
        try:
            self._lib.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError from ctypes ...
            raise NvmlUnavailable(f"nvmlInit failed: {_text(e) or type(e).__name__}") from e
        self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._active:
            self._active = False
            self._handles.clear()
            # shutting down a broken NVML must not mask the caller's exception
            with contextlib.suppress(Exception):
                self._lib.nvmlShutdown()

    @property
    def lib(self) -> Any:
        if not self._active:
            raise NvmlUnavailable("NVML is not initialised; use `with Nvml() as nv:`")
        return self._lib

    # -- error handling --------------------------------------------------------------------------------
    def _is_soft(self, err: BaseException) -> bool:
        codes = {getattr(self._lib, name, default) for name, default in _SOFT_ERRORS.items()}
        return getattr(err, "value", None) in codes

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one NVML query; a hard NVML error becomes NvmlUnavailable naming the query."""
        try:
            return fn()
        except Exception as e:
            if not self._is_nvml_error(e):
                raise
            raise NvmlUnavailable(f"{what}: {_text(e)}") from e

    def _opt(self, fn: Callable[[], T]) -> T | None:
        """Run one per-field query; "not supported"/"no permission" (and missing entry points) give None."""
        try:
            return fn()
        except Exception as e:
            if self._is_nvml_error(e) and self._is_soft(e):
                return None
            if isinstance(e, AttributeError):  # this pynvml lacks the function
                return None
            if self._is_nvml_error(e):
                raise NvmlUnavailable(_text(e)) from e
            raise

    def _is_nvml_error(self, err: BaseException) -> bool:
        cls = getattr(self._lib, "NVMLError", None)
        return isinstance(cls, type) and isinstance(err, cls)

    # -- queries ---------------------------------------------------------------------------------------
    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount", self.lib.nvmlDeviceGetCount))

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            lib = self.lib
            self._handles[index] = self._call(
                f"GPU {index}: nvmlDeviceGetHandleByIndex", lambda: lib.nvmlDeviceGetHandleByIndex(index)
            )
        return self._handles[index]

    def driver_version(self) -> str | None:
        lib = self.lib
        v = self._opt(lambda: lib.nvmlSystemGetDriverVersion())
        return None if v is None else _text(v)

    def cuda_driver_version(self) -> str | None:
        """Highest CUDA version the installed driver supports ("12.4"), or None."""
        lib = self.lib
        fn = getattr(lib, "nvmlSystemGetCudaDriverVersion_v2", None) or getattr(
            lib, "nvmlSystemGetCudaDriverVersion", None
        )
        v = self._opt(fn) if fn is not None else None
        return None if v is None else format_cuda_version(int(v))

    def info(self, index: int) -> GpuInfo:
        lib, h, opt = self.lib, self._handle(index), self._opt
        clock_sm = getattr(lib, "NVML_CLOCK_SM", _CLOCK_SM)
        clock_mem = getattr(lib, "NVML_CLOCK_MEM", _CLOCK_MEM)
        name = opt(lambda: lib.nvmlDeviceGetName(h))
        uuid = opt(lambda: lib.nvmlDeviceGetUUID(h))
        mem = opt(lambda: lib.nvmlDeviceGetMemoryInfo(h))
        cc = opt(lambda: lib.nvmlDeviceGetCudaComputeCapability(h))
        ecc = opt(lambda: lib.nvmlDeviceGetEccMode(h))
        persist = opt(lambda: lib.nvmlDeviceGetPersistenceMode(h))
        power_mw = opt(lambda: lib.nvmlDeviceGetEnforcedPowerLimit(h))
        if power_mw is None:
            power_mw = opt(lambda: lib.nvmlDeviceGetPowerManagementLimit(h))
        default_mw = opt(lambda: lib.nvmlDeviceGetPowerManagementDefaultLimit(h))
        return GpuInfo(
            index=index,
            name=None if name is None else _text(name),
            uuid=None if uuid is None else _text(uuid),
            memory_total_bytes=None if mem is None else int(mem.total),
            driver_version=self.driver_version(),
            cuda_driver_version=self.cuda_driver_version(),
            compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
            ecc_enabled=None if ecc is None else bool(ecc[0]),  # [current, pending]
            persistence_mode=None if persist is None else bool(persist),
            pcie_gen=_int(opt(lambda: lib.nvmlDeviceGetCurrPcieLinkGeneration(h))),
            pcie_gen_max=_int(opt(lambda: lib.nvmlDeviceGetMaxPcieLinkGeneration(h))),
            pcie_width=_int(opt(lambda: lib.nvmlDeviceGetCurrPcieLinkWidth(h))),
            pcie_width_max=_int(opt(lambda: lib.nvmlDeviceGetMaxPcieLinkWidth(h))),
            sm_clock_max_mhz=_int(opt(lambda: lib.nvmlDeviceGetMaxClockInfo(h, clock_sm))),
            mem_clock_max_mhz=_int(opt(lambda: lib.nvmlDeviceGetMaxClockInfo(h, clock_mem))),
            power_limit_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_default_w=None if default_mw is None else default_mw / 1000.0,
        )

    def sample(self, index: int) -> GpuSample:
        lib, h, opt = self.lib, self._handle(index), self._opt
        clock_sm = getattr(lib, "NVML_CLOCK_SM", _CLOCK_SM)
        clock_mem = getattr(lib, "NVML_CLOCK_MEM", _CLOCK_MEM)
        sensor = getattr(lib, "NVML_TEMPERATURE_GPU", _TEMPERATURE_GPU)
        util = opt(lambda: lib.nvmlDeviceGetUtilizationRates(h))
        mem = opt(lambda: lib.nvmlDeviceGetMemoryInfo(h))
        power_mw = opt(lambda: lib.nvmlDeviceGetPowerUsage(h))
        temp = opt(lambda: lib.nvmlDeviceGetTemperature(h, sensor))
        compute = opt(lambda: lib.nvmlDeviceGetComputeRunningProcesses(h))
        graphics = opt(lambda: lib.nvmlDeviceGetGraphicsRunningProcesses(h))
        reasons_fn = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        bits = opt(lambda: reasons_fn(h)) if reasons_fn is not None else None
        procs = None
        if compute is not None or graphics is not None:
            procs = sorted({int(p.pid) for p in (compute or []) + (graphics or [])})
        return GpuSample(
            index=index,
            util_gpu_pct=None if util is None else float(util.gpu),
            util_mem_pct=None if util is None else float(util.memory),
            mem_used_bytes=None if mem is None else int(mem.used),
            mem_total_bytes=None if mem is None else int(mem.total),
            power_w=None if power_mw is None else power_mw / 1000.0,
            temperature_c=None if temp is None else float(temp),
            sm_clock_mhz=_int(opt(lambda: lib.nvmlDeviceGetClockInfo(h, clock_sm))),
            mem_clock_mhz=_int(opt(lambda: lib.nvmlDeviceGetClockInfo(h, clock_mem))),
            processes=procs,
            clock_reasons=None if bits is None else [n for b, n in CLOCK_REASONS.items() if int(bits) & b],
        )

    def samples(self) -> list[GpuSample]:
        return [self.sample(i) for i in range(self.device_count())]


def _int(v: Any) -> int | None:
    return None if v is None else int(v)
