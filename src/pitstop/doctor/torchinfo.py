"""What the installed torch was built with and what it sees, read once into a plain record.

``read_torch_build()`` is the only function in doctor that asks torch; every probe takes a
``TorchBuild`` so tests hand in a fake one (a CUDA build on a GPU machine, a CPU build, a debug build).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import metadata


@dataclass
class TorchBuild:
    version: str  # "2.14.1+cu130"
    cuda: str | None = None  # CUDA runtime the build targets ("13.0"); None for a CPU or ROCm build
    hip: str | None = None
    debug: bool = False
    build_type: str | None = None  # BUILD_TYPE from torch.__config__.show(): Release / Debug / RelWithDebInfo
    cuda_available: bool = False
    cuda_error: str | None = None  # why torch.cuda.is_available() is False, when torch says
    device_count: int = 0
    devices: list[tuple[str, tuple[int, int]]] = field(default_factory=list)  # (name, capability)
    arch_list: list[str] = field(default_factory=list)  # sm_XY the build has kernels for
    cudnn_available: bool = False
    cudnn_version: int | None = None  # 90400 style
    nccl_version: tuple[int, ...] | None = None
    cpu_capability: str | None = None  # "AVX512", "AVX2", "DEFAULT"
    mkldnn: bool = False
    mkldnn_version: str | None = None
    openmp: bool = False
    mkl: bool = False
    parallel_backend: str | None = None
    num_threads: int = 1
    num_interop_threads: int = 1
    matmul_precision: str = "highest"
    cudnn_benchmark: bool = False
    config_flags: dict[str, str] = field(default_factory=dict)  # USE_CUDA=1, USE_NCCL=ON ...
    torchvision_version: str | None = None


def parse_config(show: str) -> tuple[dict[str, str], list[str]]:
    """``torch.__config__.show()`` -> (build settings KEY=VALUE, sm_XY archs from the -gencode flags)."""
    flags: dict[str, str] = {}
    m = re.search(r"Build settings:(.*)", show)
    if m:
        for part in m.group(1).split(", "):
            key, sep, value = part.strip().partition("=")
            if sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
                flags[key] = value.strip()
    archs = sorted(set(re.findall(r"code=(sm_\d+a?)", show)), key=lambda s: int(re.sub(r"\D", "", s)))
    return flags, archs


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def read_torch_build() -> TorchBuild:
    """Ask the installed torch. Imports torch (not torchvision: its version comes from package metadata)."""
    import torch

    show = torch.__config__.show()
    flags, archs = parse_config(show)
    b = TorchBuild(
        version=torch.__version__,
        cuda=torch.version.cuda,
        hip=getattr(torch.version, "hip", None),
        debug=bool(getattr(torch.version, "debug", False)),
        build_type=flags.get("BUILD_TYPE"),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        mkldnn=torch.backends.mkldnn.is_available(),
        openmp=torch.backends.openmp.is_available(),
        mkl=torch.backends.mkl.is_available(),
        num_threads=torch.get_num_threads(),
        num_interop_threads=torch.get_num_interop_threads(),
        matmul_precision=torch.get_float32_matmul_precision(),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        config_flags=flags,
        arch_list=archs,
        torchvision_version=_dist_version("torchvision"),
    )
    m = re.search(r"MKL-DNN v([\d.]+)", show)
    b.mkldnn_version = m.group(1) if m else None
    m = re.search(r"ATen parallel backend: (.+)", torch.__config__.parallel_info())
    b.parallel_backend = m.group(1).strip() if m else None
    if b.cuda is not None:
        import warnings

        with warnings.catch_warnings(record=True) as caught:  # "CUDA initialization: ..." says why not
            warnings.simplefilter("always")
            b.cuda_available = torch.cuda.is_available()
        if not b.cuda_available and caught:
            b.cuda_error = str(caught[-1].message).strip().splitlines()[0]
        if b.cuda_available:
            b.device_count = torch.cuda.device_count()
            b.devices = [
                (torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i)))
                for i in range(b.device_count)
            ]
            b.arch_list = list(torch.cuda.get_arch_list()) or archs
        b.cudnn_available = bool(torch.backends.cudnn.is_available())
        b.cudnn_version = torch.backends.cudnn.version() if b.cudnn_available else None
        try:
            v = torch.cuda.nccl.version()
            b.nccl_version = tuple(v) if isinstance(v, tuple) else (int(v),)
        except Exception:  # built without NCCL, or the library cannot load
            b.nccl_version = None
    return b
