import os
import socket
import sys
from collections import namedtuple

import pytest

from pitstop.host.topology import NumaNode, Topology
from pitstop.launch import netif
from pitstop.launch.allocator import ldconfig_libs, preload_env, resolve_allocator
from pitstop.launch.binding import LaunchError, plan_slots, slot_from_env, slots_to_env, thread_env
from pitstop.launch.launcher import LaunchOptions, Tools, build_plan, describe

# 2 sockets x 4 cores x 2 threads: CPUs 0-7 on node 0, 8-15 on node 1; siblings are c and c+4 per node.
TOPO = Topology(
    online_cpus=tuple(range(16)),
    nodes=(NumaNode(0, tuple(range(8)), None), NumaNode(1, tuple(range(8, 16)), None)),
    cores=tuple((b + i, b + i + 4) for b in (0, 8) for i in range(4)),
)
NO_TOOLS = Tools(None, None)
NUMACTL = Tools("/usr/bin/numactl", "/usr/bin/taskset")
Addr = namedtuple("Addr", "family address netmask broadcast ptp")
Stat = namedtuple("Stat", "isup")


def test_default_uses_one_thread_per_physical_core_split_by_node():
    slots = plan_slots(TOPO, ninstances=2)
    assert [s.cpus for s in slots] == [(0, 1, 2, 3), (8, 9, 10, 11)]
    assert [s.nodes for s in slots] == [(0,), (1,)]
    assert plan_slots(TOPO, ninstances=1, use_logical_cores=True)[0].cpus == tuple(range(16))


def test_core_list_node_id_and_cores_per_instance():
    slots = plan_slots(TOPO, ninstances=3, ncores_per_instance=2, core_list="2-7")
    assert [s.cpulist for s in slots] == ["2-3", "4-5", "6-7"]
    assert plan_slots(TOPO, node_id=1)[0].cpus == (8, 9, 10, 11)
    # the process's affinity restricts the default choice
    assert plan_slots(TOPO, allowed={0, 1, 8})[0].cpus == (0, 1, 8)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"core_list": "0-3,99"}, "not online"),
        ({"core_list": "3-1"}, "cannot parse"),
        ({"ninstances": 9}, "only 8 CPUs"),
        ({"ninstances": 2, "ncores_per_instance": 5}, "needs 10 CPUs"),
        ({"node_id": 4}, "does not exist"),
        ({"core_list": "0-1,8", "node_id": 0}, "not on NUMA node 0"),
        ({"core_list": "0-2", "allowed": {0, 1}}, "outside this process"),
        ({"ninstances": 0}, "at least 1"),
    ],
)
def test_bad_requests_are_clear_errors(kwargs, message):
    with pytest.raises(LaunchError, match=message):
        plan_slots(TOPO, **kwargs)


def test_thread_env_pins_openmp_to_the_slot():
    env = thread_env((4, 5, 6))
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert env["GOMP_CPU_AFFINITY"] == "4-6"
    assert env["KMP_AFFINITY"] == "granularity=fine,proclist=[4-6],explicit"


def test_instances_with_numactl_dry_run_command_and_env():
    plan = build_plan(LaunchOptions(["train.py", "--lr", "1"], ninstances=2), TOPO, {}, NUMACTL)
    a, b = plan.procs
    assert a.argv[:3] == ["/usr/bin/numactl", "--physcpubind=0-3", "--membind=0"]
    assert b.argv[:3] == ["/usr/bin/numactl", "--physcpubind=8-11", "--membind=1"]
    assert a.argv[3:] == [sys.executable, "train.py", "--lr", "1"]
    assert a.env["OMP_NUM_THREADS"] == "4" and b.env["GOMP_CPU_AFFINITY"] == "8-11"
    assert (a.env["PITSTOP_INSTANCE"], b.env["PITSTOP_INSTANCE"]) == ("0", "1")
    assert a.affinity is None
    text = describe(plan)
    assert "numactl --physcpubind=8-11 --membind=1" in text and "OMP_NUM_THREADS=4" in text


def test_cgroup_quota_below_the_plan_is_noted():
    plan = build_plan(LaunchOptions(["t.py"]), TOPO, {"OMP_NUM_THREADS": "32"}, NUMACTL, cpu_quota=2.5)
    assert any("quota is 2.5 CPUs but 8 threads" in n for n in plan.notes)
    assert any("your OMP_NUM_THREADS=32 is replaced" in n for n in plan.notes)
    assert not any(
        "quota" in n for n in build_plan(LaunchOptions(["t.py"]), TOPO, {}, NUMACTL, cpu_quota=8).notes
    )


def test_fallback_binders_and_missing_numactl():
    plan = build_plan(LaunchOptions(["-m", "pkg.run"], core_list="1"), TOPO, {}, Tools(None, "/bin/taskset"))
    assert plan.procs[0].argv[:3] == ["/bin/taskset", "-c", "1"]
    assert plan.procs[0].argv[4:6] == ["-m", "pkg.run"]
    plan = build_plan(LaunchOptions(["train.py"], core_list="1"), TOPO, {}, NO_TOOLS)
    assert plan.procs[0].affinity == (1,) and plan.procs[0].argv[1] == "train.py"
    assert "sched_setaffinity" in describe(plan)
    with pytest.raises(LaunchError, match="numactl is not installed"):
        build_plan(LaunchOptions(["train.py"], bind="numactl"), TOPO, {}, NO_TOOLS)
    # a non-Python command runs as given
    plan = build_plan(LaunchOptions(["./run.sh", "x"], bind="none"), TOPO, {}, NO_TOOLS)
    assert plan.procs[0].argv == ["./run.sh", "x"] and "GOMP_CPU_AFFINITY" not in plan.procs[0].env


def test_allocator_found_via_ldconfig_and_dirs(tmp_path):
    so = tmp_path / "libjemalloc.so.2"
    so.write_bytes(b"")
    cache = ldconfig_libs(
        f"\tlibjemalloc.so.2 (libc6,x86-64) => {so}\n\tlibc.so.6 (libc6) => /lib/libc.so.6\n"
    )
    alloc, note = resolve_allocator("jemalloc", cache, [])
    assert alloc is not None and alloc.path == str(so) and note is None
    env = preload_env(alloc, {"LD_PRELOAD": "/x/libfoo.so"})
    assert env["LD_PRELOAD"] == f"{so}:/x/libfoo.so" and "MALLOC_CONF" in env
    assert "MALLOC_CONF" not in preload_env(alloc, {"MALLOC_CONF": "mine"})
    tc = tmp_path / "libtcmalloc_minimal.so.4"
    tc.write_bytes(b"")
    alloc, _ = resolve_allocator("tcmalloc", {}, [tmp_path])
    assert alloc is not None and alloc.path == str(tc) and alloc.env == {}
    plan = build_plan(
        LaunchOptions(["t.py"], allocator="tcmalloc"), TOPO, {}, NO_TOOLS, alloc_dirs=[tmp_path], ldconfig={}
    )
    assert plan.procs[0].env["LD_PRELOAD"] == str(tc)


def test_allocator_missing():
    with pytest.raises(LaunchError, match="not found"):
        resolve_allocator("jemalloc", {}, [])
    # auto without either library falls back to tuning glibc through its environment, and says so.
    alloc, note = resolve_allocator("auto", {}, [])
    assert alloc is not None and alloc.name == "glibc" and "no jemalloc or tcmalloc" in note
    assert resolve_allocator("none", {}, []) == (None, None)


def test_glibc_allocator_sets_malloc_env_and_preloads_nothing():
    glibc, note = resolve_allocator("glibc", {}, [])
    assert note is None and glibc.path == ""
    env = preload_env(glibc, {"LD_PRELOAD": "/x/libfoo.so"})
    assert "LD_PRELOAD" not in env  # the user's preload is left as it is
    assert env == {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
    assert "MALLOC_TRIM_THRESHOLD_" not in preload_env(glibc, {"MALLOC_TRIM_THRESHOLD_": "0"})  # user's wins
    plan = build_plan(LaunchOptions(["t.py"], allocator="glibc"), TOPO, {}, NO_TOOLS, ldconfig={})
    assert plan.procs[0].env["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20)
    assert "LD_PRELOAD" not in plan.procs[0].env


def test_torchrun_single_node_splits_cores_among_ranks():
    plan = build_plan(LaunchOptions(["python", "train.py", "a"], nproc_per_node=2), TOPO, {}, NUMACTL)
    (p,) = plan.procs
    assert p.argv[1:5] == ["-m", "torch.distributed.run", "--nproc-per-node", "2"]
    assert "--standalone" in p.argv
    assert p.argv[-4:] == ["-m", "pitstop.launch.bootstrap", "train.py", "a"]
    assert p.env["PITSTOP_RANK_CPUS"] == "0-3;8-11"
    assert slot_from_env(p.env, 1) == [8, 9, 10, 11]
    assert slot_from_env(p.env, 2) is None
    assert "NCCL_SOCKET_IFNAME" not in p.env
    assert slots_to_env(plan.slots) == "0-3;8-11"
    with pytest.raises(LaunchError, match="Python script or module"):
        build_plan(LaunchOptions(["./run.sh"], nproc_per_node=2), TOPO, {}, NUMACTL)


def test_torchrun_multi_node_sets_interface_that_reaches_master(monkeypatch):
    monkeypatch.setattr(netif, "source_address", lambda ip, port, family=socket.AF_INET: "10.1.2.3")
    addrs = {
        "lo": [Addr(socket.AF_INET, "127.0.0.1", None, None, None)],
        "docker0": [Addr(socket.AF_INET, "172.17.0.1", None, None, None)],
        "ens5": [Addr(socket.AF_INET, "10.1.2.3", None, None, None)],
    }
    stats = {n: Stat(True) for n in addrs}
    opts = LaunchOptions(
        ["train.py"], nproc_per_node=8, nnodes=2, node_rank=1, master_addr="10.1.2.1", use_logical_cores=True
    )
    plan = build_plan(opts, TOPO, {"NCCL_ALGO": "Ring"}, NUMACTL, net=(addrs, stats))
    (p,) = plan.procs
    assert p.env["NCCL_SOCKET_IFNAME"] == "ens5" and p.env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert p.argv[p.argv.index("--master-addr") :][:2] == ["--master-addr", "10.1.2.1"]
    assert p.argv[p.argv.index("--node-rank") + 1] == "1"
    assert len(p.env["PITSTOP_RANK_CPUS"].split(";")) == 8
    assert any("NCCL_ALGO=Ring" in n for n in plan.notes)
    # a user's interface that does not exist is an error; an interface that is down too
    with pytest.raises(LaunchError, match="no interface eth9"):
        build_plan(opts, TOPO, {"NCCL_SOCKET_IFNAME": "eth9"}, NUMACTL, net=(addrs, stats))
    with pytest.raises(LaunchError, match="is down"):
        build_plan(opts, TOPO, {}, NUMACTL, net=(addrs, {**stats, "ens5": Stat(False)}))
    rdzv = LaunchOptions(["train.py"], nproc_per_node=1, nnodes=2, rdzv_endpoint="10.1.2.1:29400")
    p = build_plan(rdzv, TOPO, {}, NUMACTL, net=(addrs, stats)).procs[0]
    assert (
        p.argv[p.argv.index("--rdzv-endpoint") + 1] == "10.1.2.1:29400"
        and p.env["NCCL_SOCKET_IFNAME"] == "ens5"
    )


def test_multi_node_errors():
    with pytest.raises(LaunchError, match="use --nproc-per-node"):
        build_plan(LaunchOptions(["t.py"], nproc_per_node=2, ninstances=2), TOPO, {}, NUMACTL)
    with pytest.raises(LaunchError, match=r"--node-rank 2 must be in 0\.\.1"):
        build_plan(LaunchOptions(["t.py"], nnodes=2, node_rank=2, master_addr="10.0.0.1"), TOPO, {}, NUMACTL)
    with pytest.raises(LaunchError, match="needs --master-addr"):
        build_plan(LaunchOptions(["t.py"], nnodes=2), TOPO, {}, NUMACTL)
    with pytest.raises(LaunchError, match="loopback"):
        build_plan(LaunchOptions(["t.py"], nnodes=2, master_addr="127.0.0.1"), TOPO, {}, NUMACTL)
    with pytest.raises(LaunchError, match="cannot resolve"):
        build_plan(LaunchOptions(["t.py"], nnodes=2, master_addr="no-such-host.invalid"), TOPO, {}, NUMACTL)
    with pytest.raises(LaunchError, match="HOST:PORT"):
        build_plan(LaunchOptions(["t.py"], nnodes=2, rdzv_endpoint="host"), TOPO, {}, NUMACTL)


def test_real_route_lookup_on_loopback():
    route = netif.route_to_master("127.0.0.1", 29500)
    assert route.loopback and route.source_ip == "127.0.0.1"
    assert netif.interface_of("127.0.0.1") is not None
    assert netif.check_ifname("^docker,lo", {"lo": []}) == []
    assert netif.check_ifname("=eth", {"eth0": []}) == ["eth"]


def test_plan_on_this_machine_matches_affinity():
    from pitstop.host.topology import read_topology

    allowed = os.sched_getaffinity(0)
    plan = build_plan(LaunchOptions(["t.py"], use_logical_cores=True), read_topology(), {}, NO_TOOLS, allowed)
    assert set(plan.slots[0].cpus) <= allowed


def test_torchrun_ranks_bound_next_to_their_gpu(tmp_path):
    from pitstop.launch.gpu_numa import nvidia_gpu_nodes

    # fake sysfs: 4 GPUs (two on each node, listed in PCI order) and an NVSwitch bridge
    for addr, node, cls in [
        ("0000:1b:00.0", 1, "0x030200"),
        ("0000:0a:00.0", 0, "0x030200"),
        ("0000:2c:00.0", 1, "0x030200"),
        ("0000:0b:00.0", 0, "0x030000"),
        ("0000:0c:00.0", 0, "0x068000"),
    ]:
        d = tmp_path / addr
        d.mkdir()
        (d / "numa_node").write_text(f"{node}\n")
        (d / "class").write_text(cls + "\n")
    (tmp_path / "module").mkdir()
    nodes = nvidia_gpu_nodes(tmp_path)
    assert nodes == [0, 0, 1, 1]
    opts = LaunchOptions(["train.py"], nproc_per_node=4)
    # CUDA_VISIBLE_DEVICES reorders: rank 0 -> GPU 2 (node 1), rank 1 -> GPU 0 (node 0), ...
    env = {"CUDA_VISIBLE_DEVICES": "2,0,3,1"}
    plan = build_plan(opts, TOPO, env, NUMACTL, gpu_nodes=nodes)
    assert plan.procs[0].env["PITSTOP_RANK_CPUS"] == "8-9;0-1;10-11;2-3"
    assert any("rank 0 -> node 1" in n for n in plan.notes)
    # without GPU information, or with UUIDs in CUDA_VISIBLE_DEVICES: consecutive slots
    assert build_plan(opts, TOPO, {}, NUMACTL).procs[0].env["PITSTOP_RANK_CPUS"] == "0-1;2-3;8-9;10-11"
    uuid = build_plan(opts, TOPO, {"CUDA_VISIBLE_DEVICES": "GPU-1,GPU-2"}, NUMACTL, gpu_nodes=nodes)
    assert uuid.procs[0].env["PITSTOP_RANK_CPUS"] == "0-1;2-3;8-9;10-11"
    assert nvidia_gpu_nodes(tmp_path / "nope") == []
