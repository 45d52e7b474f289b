"""pitstop sysctl against a fake /proc/sys tree and a tmp drop-in dir: never the real /etc or /proc/sys."""

import argparse
import json
import subprocess

import pytest

from pitstop.launch import sysctl as sc
from pitstop.launch.cli import register
from pitstop.launch.sysctl_cli import run_sysctl

FAKE = {
    "fs.file-max": "9223372036854775807",
    "fs.nr_open": "1048576",
    "net.core.rmem_max": "212992",
    "net.core.wmem_max": "212992",
    "net.ipv4.tcp_rmem": "4096\t131072\t6291456",
    "net.ipv4.tcp_wmem": "4096\t16384\t4194304",
    "vm.swappiness": "60",
    "vm.max_map_count": "65530",
    "kernel.numa_balancing": "1",
}


@pytest.fixture
def tree(tmp_path):
    proc = tmp_path / "proc_sys"
    for name, value in FAKE.items():
        p = sc.sysctl_path(name, proc)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(value + "\n")
    sys_root = tmp_path / "sys"
    thp = sys_root / "kernel" / "mm" / "transparent_hugepage"
    thp.mkdir(parents=True)
    (thp / "enabled").write_text("always madvise [never]\n")
    return proc, sys_root, tmp_path / "etc" / "sysctl.d" / "90-pitstop.conf"


def ns_for(*argv):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["sysctl", *argv])


def run(tree, *extra, numa_nodes=1, **kw):
    proc, sys_root, dropin = tree
    ns = ns_for("--proc-sys", str(proc), "--sys-root", str(sys_root), "--path", str(dropin), "-q", *extra)
    return run_sysctl(ns, numa_nodes=numa_nodes, **kw)


def test_rules():
    p = {x.name: x for x in sc.PARAMS}
    assert sc.assess(p["vm.swappiness"], "60").write == "10"
    assert sc.assess(p["vm.swappiness"], "1").ok is True
    assert sc.assess(p["vm.max_map_count"], "65530").ok is False
    tcp = sc.assess(p["net.ipv4.tcp_rmem"], "4096 131072 6291456")
    assert tcp.ok is False and tcp.write == "4096 131072 67108864"
    assert sc.assess(p["net.ipv4.tcp_rmem"], "4096 131072 134217728").ok is True
    assert sc.assess(p["kernel.numa_balancing"], "1", numa_nodes=2).write == "0"
    assert sc.assess(p["kernel.numa_balancing"], "1", numa_nodes=1).ok is True  # does not matter on one node
    assert sc.assess(p["fs.nr_open"], None).ok is None
    assert sc.assess(p["fs.nr_open"], "lots").ok is None


def test_thp_mode_reads_the_selected_mode(tree, tmp_path):
    from pitstop.host.memory import thp_mode

    assert thp_mode(tree[1]) == "never"
    assert thp_mode(tmp_path / "nowhere") is None


def test_report_current_vs_recommended(tree, tmp_path):
    out = tmp_path / "r.json"
    assert run(tree, "--json", str(out)) == 0
    d = json.loads(out.read_text())
    f = {x["id"]: x for x in d["findings"]}
    assert f["sysctl.vm.swappiness"]["severity"] == "warn"
    assert f["sysctl.vm.swappiness"]["data"]["current"] == "60"
    assert f["sysctl.fs.file-max"]["severity"] == "pass"
    assert f["sysctl.thp"]["severity"] == "info" and "madvise" in f["sysctl.thp"]["fix_code"]
    assert f["sysctl.net.core.rmem_max"]["severity"] == "info"  # multi-node only, as doctor says
    assert f["sysctl.net.ipv4.tcp_rmem"]["data"]["write"] == "4096 131072 67108864"
    assert {r["name"] for r in d["sections"]["parameters"]} >= set(FAKE) | {"transparent_hugepage"}
    assert not tree[2].exists()  # a report writes nothing


def test_one_check_one_verdict_in_sysctl_and_doctor(tree, tmp_path):
    from pitstop.doctor import memory, system

    proc, sys_root, _ = tree
    (proc.parent / "meminfo").write_text("MemTotal: 8000000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
    out = tmp_path / "r.json"
    assert run(tree, "--json", str(out)) == 0
    f = {x["id"]: x for x in json.loads(out.read_text())["findings"]}
    assert f["sysctl.vm.swappiness"]["severity"] == "pass"  # no swap: swappiness is moot
    assert "no swap" in f["sysctl.vm.swappiness"]["evidence"]
    (proc.parent / "meminfo").write_text(
        "MemTotal: 8000000 kB\nSwapTotal: 2000000 kB\nSwapFree: 2000000 kB\n"
    )
    assert run(tree, "--json", str(out)) == 0
    f = {x["id"]: x for x in json.loads(out.read_text())["findings"]}
    assert f["sysctl.vm.swappiness"]["severity"] == "warn"
    # doctor's rows on the same settings give sysctl's verdicts
    assert system.check_net_buffers(proc)[0].severity.value == f["sysctl.net.core.rmem_max"]["severity"]
    fd = {x.id: x for x in system.check_fd_limits((65536, 65536), proc)}
    assert fd["system.file_max"].severity.value == f["sysctl.fs.file-max"]["severity"] == "pass"
    sc.sysctl_path("fs.file-max", proc).write_text("1000000\n")  # above doctor's old 65536, below the rule
    assert run(tree, "--json", str(out)) == 0
    f = {x["id"]: x for x in json.loads(out.read_text())["findings"]}
    fd = {x.id: x for x in system.check_fd_limits((65536, 65536), proc)}
    assert fd["system.file_max"].severity.value == f["sysctl.fs.file-max"]["severity"] == "warn"
    assert memory.check_thp(sys_root)[0].severity.value == f["sysctl.thp"]["severity"]


def test_apply_then_revert_on_fake_tree(tree, tmp_path):
    proc, _, dropin = tree
    out = tmp_path / "a.json"
    assert run(tree, "--apply", "--yes", "--json", str(out), is_root=False, numa_nodes=2) == 0
    written = sc.parse_dropin(dropin.read_text())
    assert written["vm.swappiness"] == "10" and written["net.core.rmem_max"] == str(64 * 2**20)
    assert written["kernel.numa_balancing"] == "0"  # two NUMA nodes
    assert "fs.file-max" not in written and "transparent_hugepage" not in written
    assert sc.read_sysctl("vm.swappiness", proc) == "10"  # loaded into the (fake) tree
    assert sc.backup_path(dropin).exists()
    d = json.loads(out.read_text())
    f = {x["id"]: x for x in d["findings"]}
    assert f["sysctl.vm.swappiness"]["severity"] == "pass"  # state after loading
    assert "wrote 7 parameters" in f["sysctl.apply"]["evidence"]
    # apply again: the backup still holds the state before the first apply
    assert run(tree, "--apply", "--yes", is_root=False, numa_nodes=2) == 0
    assert run(tree, "--revert", is_root=False) == 0
    assert sc.read_sysctl("kernel.numa_balancing", proc) == "1"
    assert not dropin.exists() and not sc.backup_path(dropin).exists()
    assert sc.read_sysctl("vm.swappiness", proc) == "60"
    assert sc.read_sysctl("net.ipv4.tcp_rmem", proc) == "4096 131072 6291456"
    assert run(tree, "--revert", is_root=False) == 2  # nothing left to revert


def test_revert_restores_a_previous_dropin(tree):
    dropin = tree[2]
    dropin.parent.mkdir(parents=True)
    dropin.write_text("vm.swappiness = 30\n")
    assert run(tree, "--apply", "--yes", is_root=False) == 0
    assert "vm.swappiness = 10" in dropin.read_text()
    assert run(tree, "--revert", is_root=False) == 0
    assert dropin.read_text() == "vm.swappiness = 30\n"


def test_live_kernel_uses_sysctl_as_root_and_prints_the_command_otherwise(
    tree, tmp_path, monkeypatch, capsys
):
    _, sys_root, dropin = tree
    monkeypatch.setattr(sc, "load_values", lambda *a: pytest.fail("must not write /proc/sys directly"))
    calls = []

    def fake_runner(cmd):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    # Reads the real /proc/sys (read-only); the runner is fake, so nothing is changed.
    args = [
        "--sys-root",
        str(sys_root),
        "--path",
        str(dropin),
        "--apply",
        "--yes",
        "--json",
        str(tmp_path / "x.json"),
    ]
    assert run_sysctl(ns_for(*args, "-q"), is_root=False, runner=fake_runner) == 0
    f = {x["id"]: x for x in json.loads((tmp_path / "x.json").read_text())["findings"]}
    if dropin.exists():  # something on this host is below the recommendation
        assert calls == []
        assert f["sysctl.apply"]["fix_code"] == f"sudo sysctl --load {dropin}"
        assert run_sysctl(ns_for(*args, "-q"), is_root=True, runner=fake_runner) == 0
        assert calls == [["sysctl", "--load", str(dropin)]]
        calls.clear()
        assert (
            run_sysctl(ns_for("--path", str(dropin), "--revert", "-q"), is_root=True, runner=fake_runner) == 0
        )
        assert calls and calls[0][:2] == ["sysctl", "-w"] and all("=" in a for a in calls[0][2:])
    else:
        assert f["sysctl.apply"]["severity"] == "pass"


def test_apply_needs_consent(tree):
    dropin = tree[2]
    assert run(tree, "--apply", confirm=lambda q: False, is_root=False) == 2
    assert not dropin.exists()
    assert run(tree, "--apply", is_root=False) == 2  # stdin is not a terminal under pytest
    assert not dropin.exists()
    assert run(tree, "--apply", confirm=lambda q: True, is_root=False) == 0
    assert dropin.exists()
    assert run(tree, "--apply", "--revert") == 2
