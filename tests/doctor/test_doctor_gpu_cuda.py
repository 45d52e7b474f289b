from __future__ import annotations

from pitstop.doctor import cuda, gpu
from pitstop.findings import Severity


def _by_id(findings):
    return {f.id: f for f in findings}


def test_read_gpus_with_fake_nvml(fake_nvml, tmp_path):
    inv = gpu.read_gpus(fake_nvml, tmp_path)
    assert inv.nvml_ok and inv.driver_version == "550.54.15" and inv.cuda_driver_version == "12.4"
    assert [g.name for g in inv.gpus] == ["NVIDIA A100-SXM4-40GB"] and len(inv.samples) == 1


def test_healthy_gpu_machine(fake_nvml, tmp_path, build_factory):
    fake_nvml.gpus[0]["pids"] = []
    fake_nvml.gpus[0]["util"] = (0, 0)
    fake_nvml.gpus[0]["mem_used"] = 2**29
    inv = gpu.read_gpus(fake_nvml, tmp_path)
    b = build_factory()
    f = _by_id(
        gpu.check_presence(inv, b)
        + gpu.check_nvml(inv)
        + gpu.check_models(inv)
        + gpu.check_settings(inv)
        + gpu.check_pcie(inv)
        + gpu.check_busy(inv, own_pid=1)
        + cuda.check_build(inv, b)
        + cuda.check_driver_compat(inv, b)
        + cuda.check_cuda_usable(inv, b, {})
        + cuda.check_arch(b)
        + cuda.check_cudnn_nccl(inv, b)
        + cuda.check_precision_hints(inv, b)
    )
    for fid in ("gpu.presence", "gpu.driver", "gpu.model", "gpu.persistence", "gpu.pcie", "gpu.busy",
                "cuda.build", "cuda.driver_compat", "cuda.visible", "cuda.arch", "cuda.cudnn", "cuda.nccl"):  # fmt: skip
        assert f[fid].severity is Severity.PASS, (fid, f[fid])
        assert f[fid].evidence
    assert "A100" in f["gpu.model"].evidence and "8.0" in f["gpu.model"].evidence
    assert "cuDNN 9.1.0" in f["cuda.cudnn"].title
    assert f["cuda.tf32"].fix_code and "set_float32_matmul_precision" in f["cuda.tf32"].fix_code
    assert f["cuda.cudnn_benchmark"].fix_code == "torch.backends.cudnn.benchmark = True"


def test_gpu_with_cpu_only_build_gives_install_command(fake_nvml, tmp_path, build_factory):
    inv = gpu.read_gpus(fake_nvml, tmp_path)  # driver supports CUDA 12.4
    b = build_factory(version="2.5.1+cpu", cuda=None, cuda_available=False, device_count=0, devices=[],
                      torchvision_version="0.20.1+cpu")  # fmt: skip
    f = _by_id(cuda.check_build(inv, b) + gpu.check_presence(inv, b))
    assert f["cuda.build"].severity is Severity.ERROR
    assert f["cuda.build"].fix_code == (
        "pip install --force-reinstall torch==2.5.1 torchvision==0.20.1 "
        "--index-url https://download.pytorch.org/whl/cu124"
    )
    assert f["gpu.presence"].severity is Severity.WARN


def test_cuda_build_on_cpu_machine_suggests_cpu_index(tmp_path, build_factory):
    inv = gpu.GpuInventory(False, "NVML Shared Library Not Found")
    b = build_factory(version="2.14.1+cu130", cuda="13.0", cuda_available=False, device_count=0, devices=[],
                      torchvision_version="0.29.1+cu130")  # fmt: skip
    f = _by_id(
        cuda.check_build(inv, b, cuda_libs=3 * 2**30) + gpu.check_presence(inv, b) + gpu.check_nvml(inv)
    )
    assert f["cuda.build"].severity is Severity.INFO
    assert f["cuda.build"].fix_code.endswith("--index-url https://download.pytorch.org/whl/cpu")
    assert "torch==2.14.1 torchvision==0.29.1" in f["cuda.build"].fix_code
    assert "3.00 GiB" in f["cuda.build"].evidence
    assert f["gpu.presence"].severity is Severity.INFO and f["gpu.driver"].severity is Severity.INFO
    # no GPU: the per-GPU checks say nothing rather than guess
    assert gpu.check_models(inv) == gpu.check_pcie(inv) == gpu.check_settings(inv) == []
    assert cuda.check_precision_hints(inv, b) == []


def test_gpu_on_pci_bus_without_driver_is_an_error(tree, tmp_path, build_factory, fake_nvml):
    tree(tmp_path, {
        "bus/pci/devices/0000:01:00.0/vendor": "0x10de\n",
        "bus/pci/devices/0000:01:00.0/class": "0x030200\n",
        "bus/pci/devices/0000:00:02.0/vendor": "0x8086\n",
        "bus/pci/devices/0000:00:02.0/class": "0x030000\n",
    })  # fmt: skip
    fake_nvml.init_error = 9  # NVML_ERROR_DRIVER_NOT_LOADED
    inv = gpu.read_gpus(fake_nvml, tmp_path)
    assert inv.pci_gpus == ["0000:01:00.0"]
    b = build_factory(cuda_available=False, device_count=0, devices=[])
    f = _by_id(gpu.check_presence(inv, b) + gpu.check_nvml(inv))
    assert f["gpu.presence"].severity is Severity.ERROR and "0000:01:00.0" in f["gpu.presence"].evidence
    assert f["gpu.driver"].severity is Severity.ERROR


def test_nvml_init_failure_through_read_gpus(fake_nvml, tmp_path):
    fake_nvml.init_error = 9
    inv = gpu.read_gpus(fake_nvml, tmp_path)
    assert not inv.nvml_ok and "Driver Not Loaded" in inv.reason and inv.gpus == []


def test_degraded_gpu_settings(fake_nvml, tmp_path):
    g = fake_nvml.gpus[0]
    g.update(persistence=0, pcie_width=8, cc=(6, 1), name="Tesla P40")
    fake_nvml.unsupported.add("nvmlDeviceGetEccMode")
    inv = gpu.read_gpus(fake_nvml, tmp_path)
    f = _by_id(
        gpu.check_settings(inv) + gpu.check_pcie(inv) + gpu.check_models(inv) + gpu.check_busy(inv, own_pid=1)
    )
    assert (
        f["gpu.persistence"].severity is Severity.WARN
        and f["gpu.persistence"].fix_code == "sudo nvidia-smi -pm 1"
    )
    assert f["gpu.pcie"].severity is Severity.WARN and "x8/x16" in f["gpu.pcie"].evidence
    assert f["gpu.model"].severity is Severity.WARN
    assert "not supported" in f["gpu.ecc"].evidence
    assert f["gpu.busy"].severity is Severity.WARN and "4242" in f["gpu.busy"].evidence


def test_pcie_gen_below_max_at_idle_is_info(fake_nvml, tmp_path):
    fake_nvml.gpus[0]["pcie_gen"] = 1
    f = gpu.check_pcie(gpu.read_gpus(fake_nvml, tmp_path))[0]
    assert f.severity is Severity.INFO and "gen 1/4" in f.evidence


def test_driver_older_than_runtime(fake_nvml, tmp_path, build_factory):
    fake_nvml.cuda_driver = 12020
    inv = gpu.read_gpus(fake_nvml, tmp_path)
    f = cuda.check_driver_compat(inv, build_factory())[0]  # cu124 wheel on a 12.2 driver: same major
    assert f.severity is Severity.WARN and f.fix_code.endswith("/whl/cu121")
    fake_nvml.cuda_driver = 11080
    inv = gpu.read_gpus(fake_nvml, tmp_path)
    f = cuda.check_driver_compat(inv, build_factory())[0]
    assert f.severity is Severity.ERROR and f.fix_code.endswith("/whl/cu118")


def test_torch_cannot_use_visible_gpu(fake_nvml, tmp_path, build_factory):
    inv = gpu.read_gpus(fake_nvml, tmp_path)
    b = build_factory(
        cuda_available=False, device_count=0, devices=[], cuda_error="CUDA driver initialization failed"
    )
    f = cuda.check_cuda_usable(inv, b, {"CUDA_VISIBLE_DEVICES": ""})[0]
    assert f.severity is Severity.ERROR and "hides every GPU" in f.fix
    assert "CUDA driver initialization failed" in f.evidence


def test_arch_missing_from_build(build_factory):
    b = build_factory(devices=[("NVIDIA B200", (10, 0))], arch_list=["sm_80", "sm_90", "sm_90a"])
    assert cuda.check_arch(b)[0].severity is Severity.ERROR
    b = build_factory(devices=[("NVIDIA A10", (8, 6))], arch_list=["sm_80", "sm_90"])
    assert cuda.check_arch(b)[0].severity is Severity.PASS  # sm_80 cubins run on 8.6
    b = build_factory(devices=[("NVIDIA H200", (9, 0))], arch_list=["sm_80", "sm_90a"])
    assert cuda.check_arch(b)[0].severity is Severity.PASS


def test_no_cudnn_no_nccl_on_multi_gpu(fake_nvml, tmp_path, build_factory):
    fake_nvml.gpus.append(dict(fake_nvml.gpus[0]))
    inv = gpu.read_gpus(fake_nvml, tmp_path)
    f = _by_id(
        cuda.check_cudnn_nccl(
            inv, build_factory(cudnn_available=False, cudnn_version=None, nccl_version=None)
        )
    )
    assert f["cuda.cudnn"].severity is Severity.WARN and f["cuda.nccl"].severity is Severity.WARN


def test_slow_cuda_env():
    f = cuda.check_env({"CUDA_LAUNCH_BLOCKING": "1", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})[0]
    assert (
        f.severity is Severity.WARN
        and f.fix_code == "unset CUDA_LAUNCH_BLOCKING PYTORCH_NO_CUDA_MEMORY_CACHING"
    )
    assert cuda.check_env({"CUDA_LAUNCH_BLOCKING": "0"})[0].severity is Severity.PASS


def test_cuda_libs_bytes_measures_nvidia_dirs(tmp_path):
    (tmp_path / "nvidia" / "cublas" / "lib").mkdir(parents=True)
    (tmp_path / "nvidia" / "cublas" / "lib" / "libcublas.so").write_bytes(b"x" * 1000)
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "big").write_bytes(b"x" * 5000)
    assert cuda.cuda_libs_bytes([str(tmp_path)]) == 1000
    assert cuda.cuda_libs_bytes([str(tmp_path / "numpy")]) is None


def test_thermal_slowdown_is_a_warning(fake_nvml, tmp_path):
    f = {x.id: x for x in gpu.check_settings(gpu.read_gpus(fake_nvml, tmp_path))}
    assert (
        f["gpu.clocks"].severity is Severity.INFO and "clock limited by: gpu_idle" in f["gpu.clocks"].evidence
    )
    fake_nvml.gpus[0]["reasons"] = 0x40 | 0x4  # hw thermal slowdown + sw power cap
    f = {x.id: x for x in gpu.check_settings(gpu.read_gpus(fake_nvml, tmp_path))}
    assert f["gpu.clocks"].severity is Severity.WARN
    assert f["gpu.clocks"].data["slowdown"] == {0: ["hw_thermal_slowdown"]}


def test_power_capped_gpu(fake_nvml, tmp_path):
    f = {x.id: x for x in gpu.check_settings(gpu.read_gpus(fake_nvml, tmp_path))}
    assert f["gpu.power_limit"].severity is Severity.PASS
    fake_nvml.gpus[0]["power_limit_mw"] = 250000  # admin lowered 400 W -> 250 W
    f = {x.id: x for x in gpu.check_settings(gpu.read_gpus(fake_nvml, tmp_path))}
    assert f["gpu.power_limit"].severity is Severity.WARN
    assert "limit 250 W, default 400 W" in f["gpu.power_limit"].evidence
    assert f["gpu.power_limit"].fix_code == "sudo nvidia-smi -i 0 -pl 400"
