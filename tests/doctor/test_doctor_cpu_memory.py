from __future__ import annotations

import os
import resource
from types import SimpleNamespace

from pitstop.doctor import cpu, memory
from pitstop.findings import Severity
from pitstop.host import memory as host_memory
from pitstop.host.load import Competition
from pitstop.host.topology import read_topology

CPUINFO = "processor\t: 0\nmodel name\t: Fake Xeon 8480\nflags\t\t: fpu avx2 fma avx512f avx512bw avx512vl avx512dq amx_bf16 amx_tile\n"


def _two_socket(tree, root):
    files = {"cpu/online": "0-3", "node/node0/cpulist": "0-1", "node/node1/cpulist": "2-3"}
    for c in range(4):
        files[f"cpu/cpu{c}/topology/physical_package_id"] = str(c // 2)
        files[f"cpu/cpu{c}/topology/core_id"] = str(c % 2)
        files[f"cpu/cpu{c}/cpufreq/scaling_governor"] = "powersave"
    files["cpu/cpu0/cpufreq/scaling_driver"] = "acpi-cpufreq"
    tree(root, files)
    return read_topology(root / "cpu", root / "node")


def test_model_and_quota(tree, tmp_path):
    topo = _two_socket(tree, tmp_path)
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    f = cpu.check_model(topo, str(tmp_path / "cpuinfo"), affinity=4, quota=2.0)[0]
    assert f.severity is Severity.INFO and f.data["usable_cores"] == 2 and "Fake Xeon 8480" in f.evidence
    f = cpu.check_model(topo, str(tmp_path / "cpuinfo"), affinity=4, quota=None)[0]
    assert f.severity is Severity.PASS and f.data["physical_cores"] == 4


def test_isa_lowered_by_torch_is_a_warning(build_factory):
    flags = frozenset(CPUINFO.split(":")[-1].split())
    assert cpu.check_isa(flags, build_factory(cpu_capability="AVX2"))[0].severity is Severity.WARN
    f = cpu.check_isa(flags, build_factory(cpu_capability="AVX512"))[0]
    assert f.severity is Severity.PASS and "amx_bf16" in f.evidence
    assert (
        cpu.check_isa(frozenset({"avx2", "fma"}), build_factory(cpu_capability="AVX2"))[0].severity
        is Severity.PASS
    )
    assert cpu.check_isa(frozenset(), build_factory())[0].severity is Severity.INFO


def test_bf16_hint_follows_flags():
    assert "autocast" in cpu.check_bf16(frozenset({"avx512_bf16"}))[0].fix_code
    assert cpu.check_bf16(frozenset({"avx2"}))[0].fix_code is None


def test_bf16_finding_carries_the_measured_matmul_rates(bf16less_cpu):
    from pitstop.matmul import cpu_bf16_line, low_precision

    lp = low_precision("bfloat16", "cpu")  # faked AVX2-only CPU: bf16 ~300x slower than fp32
    (f,) = cpu.check_bf16(frozenset({"avx2"}), lp)
    assert f.title == "No bf16 hardware on this CPU: keep fp32 on the CPU"
    assert (
        f.evidence == cpu_bf16_line(check=lp)
        and "bf16 torch.mm 0.301 GFLOP/s vs fp32 89 GFLOP/s" in f.evidence
    )
    assert f.data["fp32_flops_per_s"] == lp.fp32.flops_per_s


def test_libraries_missing(build_factory):
    f = {x.id: x for x in cpu.check_libraries(build_factory(mkldnn=False, openmp=False))}
    assert f["cpu.onednn"].severity is Severity.WARN and f["cpu.openmp"].severity is Severity.WARN


def test_threads(tree, tmp_path, build_factory):
    topo = _two_socket(tree, tmp_path)
    f = {x.id: x for x in cpu.check_threads(build_factory(num_threads=16), topo, 4, {})}
    assert (
        f["cpu.threads"].severity is Severity.WARN and f["cpu.threads"].fix_code == "export OMP_NUM_THREADS=4"
    )
    assert f["cpu.thread_env"].severity is Severity.INFO
    f = {x.id: x for x in cpu.check_threads(build_factory(num_threads=4), topo, 4, {"OMP_NUM_THREADS": "4"})}
    assert f["cpu.threads"].severity is Severity.PASS and f["cpu.thread_env"].severity is Severity.PASS
    f = {
        x.id: x for x in cpu.check_threads(build_factory(num_threads=1), topo, 4, {"OMP_NUM_THREADS": "two"})
    }
    assert f["cpu.threads"].severity is Severity.INFO and f["cpu.thread_env"].severity is Severity.WARN
    env = {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "2"}
    assert {x.id: x for x in cpu.check_threads(build_factory(num_threads=4), topo, 4, env)}[
        "cpu.thread_env"
    ].severity is Severity.WARN


def test_threads_against_the_cores_other_work_leaves_free(tree, tmp_path, build_factory):
    """cpu.threads takes the machine's load into account: threads that fit the usable cores but not the
    free ones are a warning (the measured load in its evidence), a thread count within them a pass."""
    topo = _two_socket(tree, tmp_path)
    busy = Competition(
        seconds=0.5, usable_cores=4, cpus=4, other_busy_cores=2.6, steal_cores=0.3, other_runnable=3
    )
    f = {x.id: x for x in cpu.check_threads(build_factory(num_threads=4), topo, 4, {}, busy)}["cpu.threads"]
    assert f.severity is Severity.WARN and "leaves 0.7 of 4 usable cores free" in f.title
    assert f.fix_code.startswith("export OMP_NUM_THREADS=1") and f.data["fit_threads"] == 1
    assert "other processes kept 2.6 of 4 usable cores busy" in f.evidence
    quiet = Competition(
        seconds=0.5, usable_cores=4, cpus=4, other_busy_cores=0.1, steal_cores=0.0, other_runnable=0
    )
    f = {x.id: x for x in cpu.check_threads(build_factory(num_threads=4), topo, 4, {}, quiet)}["cpu.threads"]
    assert f.severity is Severity.PASS
    # one thread on a machine that leaves one core free: right, not "too few threads"
    f = {x.id: x for x in cpu.check_threads(build_factory(num_threads=1), topo, 4, {}, busy)}["cpu.threads"]
    assert f.severity is Severity.PASS


def test_governor(tree, tmp_path):
    _two_socket(tree, tmp_path)
    f = cpu.check_governor(tmp_path / "cpu")[0]
    assert f.severity is Severity.WARN and "powersave x4" in f.evidence
    (tmp_path / "cpu/cpu0/cpufreq/scaling_driver").write_text("intel_pstate")
    assert cpu.check_governor(tmp_path / "cpu")[0].severity is Severity.INFO
    for c in range(4):
        (tmp_path / f"cpu/cpu{c}/cpufreq/scaling_governor").write_text("performance")
    assert cpu.check_governor(tmp_path / "cpu")[0].severity is Severity.PASS
    assert cpu.check_governor(tmp_path / "missing")[0].severity is Severity.INFO


def test_numa_without_numactl(tree, tmp_path):
    topo = _two_socket(tree, tmp_path)
    f = {x.id: x for x in cpu.check_numa(topo, numactl=None)}
    assert f["cpu.numa"].severity is Severity.INFO and f["cpu.numa"].data["nodes"] == 2
    assert f["cpu.numactl"].severity is Severity.WARN
    assert {x.id: x for x in cpu.check_numa(topo, numactl="/usr/bin/numactl")}[
        "cpu.numactl"
    ].severity is Severity.PASS


MEMINFO = """MemTotal:        8000000 kB
MemFree:          100000 kB
MemAvailable:     400000 kB
SwapTotal:       4000000 kB
SwapFree:        1000000 kB
"""


def test_small_busy_swapping_machine(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO)
    mi = host_memory.read_meminfo(tmp_path / "meminfo")
    assert mi["MemTotal"] == 8000000 * 1024
    f = {
        x.id: x for x in memory.check_ram(mi, None) + memory.check_swap(mi, "Filename Type\n/swapfile file\n")
    }
    assert f["memory.ram"].severity is Severity.WARN
    assert f["memory.available"].severity is Severity.WARN
    assert f["memory.swap"].severity is Severity.WARN and "/swapfile" in f["memory.swap"].evidence
    assert "(0.50x RAM)" in f["memory.swap"].evidence


def test_container_memory_limit_counts(tree, tmp_path):
    tree(tmp_path, {"cg/memory.max": str(4 * 2**30)})
    limit = host_memory.cgroup_memory_limit(tmp_path / "cg")
    assert limit == 4 * 2**30
    mi = {"MemTotal": 64 * 2**30, "MemAvailable": 60 * 2**30}
    assert memory.check_ram(mi, limit)[0].severity is Severity.WARN
    tree(tmp_path, {"cg2/memory.max": "max"})
    assert host_memory.cgroup_memory_limit(tmp_path / "cg2") is None


def test_no_swap_and_unreadable_meminfo(tmp_path):
    mi = {"MemTotal": 64 * 2**30, "MemAvailable": 60 * 2**30, "SwapTotal": 0, "SwapFree": 0}
    f = memory.check_swap(mi, None)[0]
    assert f.severity is Severity.INFO and "Trade-off" in f.fix
    assert host_memory.read_meminfo(tmp_path / "nope") == {}
    assert memory.check_ram({}, None)[0].severity is Severity.WARN


def test_thp(tree, tmp_path):
    tree(tmp_path, {"kernel/mm/transparent_hugepage/enabled": "always madvise [never]"})
    f = memory.check_thp(tmp_path)[0]
    assert f.severity is Severity.INFO and f.data["mode"] == "never"
    assert memory.check_thp(tmp_path / "missing")[0].data["mode"] is None


def test_small_shm_warns():
    fake = SimpleNamespace(f_blocks=16384, f_frsize=4096, f_bavail=16000)  # 64 MiB, docker's default

    def statvfs(_path):
        return fake

    f = memory.check_shm("/dev/shm", statvfs=statvfs)[0]
    assert f.severity is Severity.WARN and "64 MiB" in f.title and "--shm-size" in f.fix_code


def test_missing_shm(tmp_path):
    f = memory.check_shm(tmp_path / "no-shm")[0]
    assert f.severity is Severity.WARN and "missing" in f.title


def test_memlock(tree, tmp_path):
    lim = (8 * 2**20, 8 * 2**20)
    assert memory.check_memlock(lim, tmp_path)[0].severity is Severity.INFO
    tree(tmp_path, {"class/infiniband/mlx5_0/ports": ""})
    assert memory.check_memlock(lim, tmp_path)[0].severity is Severity.WARN
    inf = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    assert memory.check_memlock(inf, tmp_path)[0].severity is Severity.PASS
    assert os.path.isdir(tmp_path / "class/infiniband")
