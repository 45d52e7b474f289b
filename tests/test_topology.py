import pytest

from pitstop.host.sysfs import read_int, read_sysctl, sysctl_path
from pitstop.host.topology import format_cpulist, parse_cpulist, read_topology


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpulist("") == []
    with pytest.raises(ValueError):
        parse_cpulist("3-1")
    with pytest.raises(ValueError):
        parse_cpulist("a")


def make_fake_sys(tmp_path):
    cpu, node = tmp_path / "cpu", tmp_path / "node"
    (cpu).mkdir()
    (cpu / "online").write_text("0-7\n")
    for c in range(8):
        t = cpu / f"cpu{c}" / "topology"
        t.mkdir(parents=True)
        (t / "physical_package_id").write_text(str(c // 4))
        (t / "core_id").write_text(str(c % 2))  # two threads per core
    for n, cl in ((0, "0-3"), (1, "4-7")):
        d = node / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cl + "\n")
        (d / "meminfo").write_text(f"Node {n} MemTotal:       1000 kB\n")
    return cpu, node


def test_read_fake_topology(tmp_path):
    cpu, node = make_fake_sys(tmp_path)
    t = read_topology(cpu, node)
    assert t.online_cpus == tuple(range(8))
    assert [n.cpus for n in t.nodes] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert t.nodes[1].mem_total_kb == 1000
    assert t.physical_cores == 4
    assert t.first_thread_per_core() == [0, 1, 4, 5]
    assert t.node_of(6) == 1


def test_missing_sysfs_falls_back(tmp_path):
    t = read_topology(tmp_path / "nope", tmp_path / "nope2")
    assert len(t.nodes) == 1 and t.online_cpus


def test_sysctl_reads_fake_tree(tmp_path):
    p = sysctl_path("net.ipv4.tcp_rmem", tmp_path)
    p.parent.mkdir(parents=True)
    p.write_text("4096\t131072\t6291456\n")
    assert read_sysctl("net.ipv4.tcp_rmem", tmp_path) == "4096 131072 6291456"
    assert read_sysctl("no.such", tmp_path) is None
    assert read_int(p) == 4096
