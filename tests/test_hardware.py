from pitstop.host import cpu, precision


def test_cpu_flags_from_fake_cpuinfo(tmp_path):
    p = tmp_path / "cpuinfo"
    p.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n")
    flags = cpu.cpu_flags(p)
    assert "avx512_bf16" in flags
    assert cpu.cpu_has_fast_bf16(flags)
    assert not cpu.cpu_has_fast_bf16(frozenset({"avx2"}))
    assert cpu.cpu_flags(tmp_path / "missing") == frozenset()


def test_cgroup_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpu.cgroup_cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu.cgroup_cpu_quota(tmp_path) is None
    assert cpu.cgroup_cpu_quota(tmp_path / "nothing") is None


def test_gpu_capabilities():
    assert precision.gpu_has_tensor_cores((7, 0)) and not precision.gpu_has_tensor_cores((6, 1))
    assert precision.gpu_supports_bf16((9, 0)) and not precision.gpu_supports_bf16((7, 5))
    assert precision.preferred_amp_dtype("cpu", frozenset({"amx_bf16"})) == "bfloat16"
    assert precision.preferred_amp_dtype("cpu", frozenset()) is None
    assert cpu.usable_cores() >= 1
