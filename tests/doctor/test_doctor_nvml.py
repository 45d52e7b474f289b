from __future__ import annotations

import sys

import pytest

from pitstop.host.nvml import GpuInfo, Nvml, NvmlUnavailable, format_cuda_version


def test_info_reads_every_field(fake_nvml):
    with Nvml(fake_nvml) as nv:
        assert nv.device_count() == 1
        info = nv.info(0)
    assert isinstance(info, GpuInfo)
    assert info.name == "NVIDIA A100-SXM4-40GB"  # bytes decoded
    assert info.memory_total_bytes == 40 * 2**30
    assert info.driver_version == "550.54.15"
    assert info.cuda_driver_version == "12.4"
    assert info.compute_capability == (8, 0)
    assert info.ecc_enabled is True and info.persistence_mode is True
    assert (info.pcie_gen, info.pcie_gen_max, info.pcie_width, info.pcie_width_max) == (4, 4, 16, 16)
    assert info.sm_clock_max_mhz == 1410 and info.mem_clock_max_mhz == 1215
    assert info.power_limit_w == 400.0 and info.power_limit_default_w == 400.0
    assert fake_nvml.inits == 1 and fake_nvml.shutdowns == 1


def test_sample_reads_counters(fake_nvml):
    fake_nvml.gpus.append(dict(fake_nvml.gpus[0], pids=[7, 3]))
    with Nvml(fake_nvml) as nv:
        s = nv.samples()
    assert [x.index for x in s] == [0, 1]
    assert s[0].util_gpu_pct == 87 and s[0].util_mem_pct == 40
    assert s[0].mem_used_bytes == 3 * 2**30 and s[0].mem_total_bytes == 40 * 2**30
    assert s[0].power_w == 61.0 and s[0].temperature_c == 34
    assert s[0].sm_clock_mhz == 1095 and s[0].mem_clock_mhz == 1215
    assert s[0].processes == [4242] and s[1].processes == [3, 7]
    assert s[0].clock_reasons == ["gpu_idle"]


def test_not_supported_fields_become_none(fake_nvml):
    fake_nvml.unsupported |= {
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetCurrPcieLinkGeneration",
    }
    with Nvml(fake_nvml) as nv:
        info, s = nv.info(0), nv.sample(0)
    assert info.ecc_enabled is None and info.power_limit_w is None and info.pcie_gen is None
    assert info.pcie_gen_max == 4  # the others still read
    assert s.power_w is None and s.processes is None and s.util_gpu_pct == 87
    assert s.clock_reasons == ["gpu_idle"]


def test_init_failure_is_unavailable_not_crash(fake_nvml):
    fake_nvml.init_error = 9
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"), Nvml(fake_nvml):
        pass
    assert fake_nvml.shutdowns == 0


def test_missing_pynvml_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(NvmlUnavailable, match="not installed"), Nvml():
        pass


def test_real_pynvml_without_driver_is_unavailable():
    # This machine has nvidia-ml-py but no libnvidia-ml: a clean NvmlUnavailable, whatever the cause.
    try:
        with Nvml() as nv:
            assert nv.device_count() >= 0
    except NvmlUnavailable as e:
        assert e.reason


def test_hard_error_on_bad_index_and_use_outside_context(fake_nvml):
    nv = Nvml(fake_nvml)
    with pytest.raises(NvmlUnavailable, match="not initialised"):
        nv.device_count()
    with nv, pytest.raises(NvmlUnavailable, match="GPU 5"):
        nv.info(5)


def test_format_cuda_version():
    assert format_cuda_version(12040) == "12.4"
    assert format_cuda_version(11080) == "11.8"
    assert format_cuda_version(13000) == "13.0"


def test_old_pynvml_without_most_functions(fake_nvml):
    """A pynvml that lacks newer entry points: those fields are None, nothing raises."""
    from types import SimpleNamespace

    err = type(fake_nvml).NVMLError
    lib = SimpleNamespace(
        NVMLError=err,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: object(),
        nvmlDeviceGetName=lambda h: b"Tesla T4",
    )
    with Nvml(lib) as nv:
        info, s = nv.info(0), nv.sample(0)
    assert info.name == "Tesla T4" and info.driver_version is None and info.cuda_driver_version is None
    assert info.compute_capability is None and info.pcie_width is None and s.util_gpu_pct is None
    assert s.clock_reasons is None


def test_gpu_lost_mid_query_is_unavailable(fake_nvml):
    def lost(h):
        raise type(fake_nvml).NVMLError(15)  # NVML_ERROR_GPU_IS_LOST: not a per-field "not supported"

    fake_nvml.nvmlDeviceGetPowerUsage = lost  # shadows the fake's generated getter
    with Nvml(fake_nvml) as nv, pytest.raises(NvmlUnavailable, match="15"):
        nv.sample(0)
