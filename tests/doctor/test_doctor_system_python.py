from __future__ import annotations

from dataclasses import replace

from pitstop.doctor import python_env
from pitstop.doctor import system as sysprobe
from pitstop.findings import Severity


def test_fd_limits(tree, tmp_path):
    tree(tmp_path, {"fs/file-max": "9223372036854775807"})
    f = {x.id: x for x in sysprobe.check_fd_limits((1024, 1048576), tmp_path)}
    assert (
        f["system.fd_limit"].severity is Severity.WARN
        and f["system.fd_limit"].fix_code == "ulimit -n 1048576"
    )
    assert f["system.file_max"].severity is Severity.PASS
    f = {x.id: x for x in sysprobe.check_fd_limits((65536, 65536), tmp_path / "missing")}
    assert f["system.fd_limit"].severity is Severity.PASS and f["system.file_max"].severity is Severity.INFO


def test_net_buffers(tree, tmp_path):
    tree(tmp_path, {"net/core/rmem_max": "212992", "net/core/wmem_max": "212992"})
    assert sysprobe.check_net_buffers(tmp_path)[0].severity is Severity.INFO
    tree(tmp_path, {"net/core/rmem_max": "67108864", "net/core/wmem_max": "67108864"})
    assert sysprobe.check_net_buffers(tmp_path)[0].severity is Severity.PASS


def test_nccl_socket_ifname(tmp_path):
    for name in ("lo", "eth0", "docker0", "ib0"):
        (tmp_path / name).mkdir()
    f = sysprobe.check_nccl_env({"NCCL_SOCKET_IFNAME": "enp"}, tmp_path)[0]
    assert f.severity is Severity.WARN and "matches no interface" in f.evidence
    f = sysprobe.check_nccl_env({"NCCL_SOCKET_IFNAME": "eth"}, tmp_path)[0]
    assert f.severity is Severity.PASS and f.data["socket_interfaces"] == ["eth0"]
    f = sysprobe.check_nccl_env({"NCCL_SOCKET_IFNAME": "^lo,docker"}, tmp_path)[0]
    assert f.data["socket_interfaces"] == ["eth0", "ib0"]
    f = sysprobe.check_nccl_env({"NCCL_SOCKET_IFNAME": "=eth"}, tmp_path)[0]
    assert f.severity is Severity.WARN  # exact match wanted, no interface named "eth"
    f = sysprobe.check_nccl_env({"NCCL_P2P_DISABLE": "1"}, tmp_path)[0]
    assert f.severity is Severity.WARN and "NCCL_P2P_DISABLE" in f.evidence
    assert sysprobe.check_nccl_env({}, tmp_path)[0].severity is Severity.PASS


def test_kernel():
    assert sysprobe.check_kernel("3.10.0-1160.el7.x86_64")[0].severity is Severity.WARN
    assert sysprobe.check_kernel("6.8.0-45-generic")[0].severity is Severity.PASS
    assert sysprobe.check_kernel("weird")[0].severity is Severity.PASS


def test_container_detection(tree, tmp_path):
    tree(
        tmp_path,
        {"proc/1/cgroup": "0::/kubepods/burstable/pod1234\n", "proc/cpuinfo": "flags : fpu hypervisor sse\n"},
    )
    kind, clues = sysprobe.detect_container(tmp_path, {})
    assert kind == "kubernetes" and clues
    f = sysprobe.check_container(tmp_path, {})[0]
    assert f.severity is Severity.INFO and f.data["virtual_machine"] is True
    bare = tmp_path / "bare"
    tree(bare, {"proc/1/cgroup": "0::/init.scope\n", "proc/cpuinfo": "flags : fpu sse\n"})
    f = sysprobe.check_container(bare, {})[0]
    assert f.severity is Severity.PASS and f.data["container"] is None
    tree(bare, {".dockerenv": ""})
    assert sysprobe.detect_container(bare, {})[0] == "docker"


def test_privileges():
    assert sysprobe.check_privileges(1000)[0].title.startswith("Not root")
    assert sysprobe.check_privileges(0)[0].title == "Running as root"


PY = python_env.PythonFacts(
    version=(3, 11, 7),
    implementation="cpython",
    executable="/x/.venv/bin/python",
    prefix="/x/.venv",
    base_prefix="/usr",
    debug_build=False,
    dev_mode=False,
    optimize=0,
    gil_disabled=False,
)


def test_python_version_and_env(tmp_path):
    assert python_env.check_version(PY)[0].severity is Severity.PASS
    assert python_env.check_version(replace(PY, version=(3, 8, 10)))[0].severity is Severity.WARN
    assert python_env.check_environment(PY, {})[0].data["kind"] == "virtualenv"
    system = replace(PY, prefix="/usr", base_prefix="/usr")
    assert python_env.check_environment(system, {})[0].severity is Severity.INFO
    assert python_env.check_environment(system, {"CONDA_PREFIX": "/opt/conda"})[0].data["kind"] == "conda"


def test_torchvision_pairing(build_factory):
    assert python_env.expected_torchvision("2.14.1+cu130") == (0, 29)
    assert python_env.check_torchvision(build_factory())[0].severity is Severity.PASS
    f = python_env.check_torchvision(build_factory(torchvision_version="0.19.0+cu124"))[0]
    assert (
        f.severity is Severity.ERROR and "0.20.x" in f.evidence and f.fix_code.endswith("torchvision==0.20.*")
    )
    f = python_env.check_torchvision(build_factory(torchvision_version="0.20.1+cpu"))[0]
    assert f.severity is Severity.ERROR and "cu124 vs cpu" in f.evidence
    assert python_env.check_torchvision(build_factory(torchvision_version=None))[0].severity is Severity.INFO


def test_debug_builds_and_switches(build_factory):
    assert python_env.check_debug(PY, build_factory(), {})[0].severity is Severity.PASS
    f = python_env.check_debug(PY, build_factory(debug=True, build_type="Debug"), {})[0]
    assert f.severity is Severity.ERROR
    f = python_env.check_debug(PY, build_factory(), {"PYTHONMALLOC": "debug", "PYTHONTRACEMALLOC": "1"})[0]
    assert f.severity is Severity.WARN and "PYTHONMALLOC=debug" in f.evidence
    assert (
        python_env.check_debug(replace(PY, dev_mode=True), build_factory(), {})[0].severity is Severity.WARN
    )


def test_read_python_here():
    py = python_env.read_python()
    assert py.version >= (3, 11) and py.executable
