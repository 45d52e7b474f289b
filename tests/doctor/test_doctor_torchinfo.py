from __future__ import annotations

from pitstop.doctor.torchinfo import parse_config, read_torch_build

SHOW = """PyTorch built with:
  - Intel(R) MKL-DNN v3.5.3 (Git Hash 66f0cb9eb66affd2da3bf5f8d897376f04aae6af)
  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, CUDA_FLAGS= -gencode arch=compute_80,code=sm_80 \
-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_100,code=sm_100 -gencode arch=compute_75,code=sm_75 \
-Xfatbin, CUDA_VERSION=12.8, USE_CUDA=ON, USE_NCCL=1, USE_MKLDNN=ON,
"""


def test_parse_config_flags_and_archs():
    flags, archs = parse_config(SHOW)
    assert flags["BUILD_TYPE"] == "Release" and flags["CUDA_VERSION"] == "12.8" and flags["USE_NCCL"] == "1"
    assert archs == ["sm_75", "sm_80", "sm_90a", "sm_100"]
    assert parse_config("nothing here") == ({}, [])


def test_read_torch_build_here():
    b = read_torch_build()
    import torch

    assert b.version == torch.__version__ and b.num_threads == torch.get_num_threads()
    assert b.cpu_capability and b.build_type in ("Release", "Debug", "RelWithDebInfo", "MinSizeRel", None)
    if (
        b.cuda and not b.cuda_available
    ):  # a CUDA wheel here, without a GPU: kernels still listed from the config
        assert b.device_count == 0 and b.arch_list
