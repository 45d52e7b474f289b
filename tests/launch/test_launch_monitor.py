"""pitstop monitor: real CPU/disk sampling of a short command here; NVML paths with a fake pynvml."""

import argparse
import csv
import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from pitstop.host.nvml import GpuSample, Nvml
from pitstop.launch.cli import register
from pitstop.launch.monitor import CsvLog, LowUtilRule, Sample, Sampler
from pitstop.launch.monitor_cli import run_monitor
from pitstop.launch.monitor_plot import PlotError, plot_csv, read_csv
from pitstop.launch.monitor_view import render

GIB = 2**30


class FakeNVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_pynvml(util=30, pids=(4242,), fail_after=None, power_supported=True):
    """A module-like object with the pynvml calls pitstop.host.nvml makes, for one GPU."""
    calls = {"count": 0, "shutdown": 0}

    def count():
        calls["count"] += 1
        if fail_after is not None and calls["count"] > fail_after:
            raise FakeNVMLError(15)  # GPU is lost: a hard error
        return 1

    def power(h):
        if not power_supported:
            raise FakeNVMLError(3)  # NOT_SUPPORTED
        return 123_000

    return SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVML_ERROR_NOT_SUPPORTED=3,
        calls=calls,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        nvmlDeviceGetCount=count,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=util, memory=12),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=4 * GIB, total=80 * GIB, free=76 * GIB),
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetTemperature=lambda h, s: 61,
        nvmlDeviceGetClockInfo=lambda h, c: 1410 if c == 1 else 1593,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=p) for p in pids],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
    )


def no_driver():
    raise OSError("no driver")


def parse(*argv):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["monitor", *argv])


def monitor(*argv, **kw):
    ns = parse(*argv)
    cmd = list(ns.cmd or [])
    return run_monitor(ns, cmd[1:] if cmd[:1] == ["--"] else cmd, **kw)


def rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _block_backed(path) -> bool:
    best, fstype = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mnt, typ, *_ = line.split()
        if str(path).startswith(mnt) and len(mnt) > len(best):
            best, fstype = mnt, typ
    return fstype not in ("tmpfs", "ramfs", "")


def test_follows_a_command_and_logs_real_cpu_and_disk(tmp_path):
    blob = tmp_path / "blob.bin"
    work = textwrap.dedent(
        f"""
        import os, sys
        with open({str(blob)!r}, "wb") as f:
            f.write(os.urandom(16 << 20)); f.flush(); os.fsync(f.fileno())
        x = sum(i * i for i in range(6_000_000))  # CPU work, during which samples see the write
        print("done", x > 0)
        sys.exit(5)
        """
    )
    out_csv, out_json, log = tmp_path / "m.csv", tmp_path / "m.json", tmp_path / "cmd.log"
    rc = monitor(
        "--interval",
        "0.2",
        "--csv",
        str(out_csv),
        "--json",
        str(out_json),
        "-q",
        "--command-log",
        str(log),
        "--",
        sys.executable,
        "-c",
        work,
        nvml_lib=SimpleNamespace(nvmlInit=no_driver),
    )
    assert rc == 5  # the command's exit code
    assert log.read_text().strip() == "done True"
    data = rows(out_csv)
    assert data and {"cpu_pct", "cpu0_pct", "disk_write_mb_s", "proc_cpu_pct", "ram_used_gib"} <= set(data[0])
    assert max(float(r["cpu_pct"]) for r in data) > 0
    assert all(0 <= float(r["cpu_pct"]) <= 100 for r in data)
    assert float(data[0]["ram_used_gib"]) > 0
    assert not any(k.startswith("gpu") for k in data[0])
    if _block_backed(tmp_path):
        # integrate the write rate over the run: at least the 16 MB the command fsync'd
        t_prev, written = 0.0, 0.0
        for r in data:
            written += float(r["disk_write_mb_s"]) * (float(r["time_s"]) - t_prev)
            t_prev = float(r["time_s"])
        assert written >= 16 * 2**20 / 1e6 * 0.95
        by_command = sum(
            float(r["proc_write_mb_s"] or 0) * (float(r["time_s"]) - float(p["time_s"]))
            for p, r in zip([{"time_s": 0}, *data], data, strict=False)
        )
        assert by_command >= 16 * 2**20 / 1e6 * 0.95
    rep = json.loads(out_json.read_text())
    f = {x["id"]: x for x in rep["findings"]}
    assert f["monitor.gpu"]["severity"] == "info" and "no driver" in f["monitor.gpu"]["evidence"]
    assert "command exited with 5" in f["monitor.run"]["evidence"]
    assert rep["sections"]["summary"]["samples"] == len(data)


def test_fake_gpu_low_utilization_is_flagged(tmp_path):
    lib = fake_pynvml(util=30, power_supported=False)
    out_csv, out_json = tmp_path / "g.csv", tmp_path / "g.json"
    rc = monitor(
        "--interval",
        "0.05",
        "--duration",
        "0.3",
        "--window",
        "0.1",
        "--csv",
        str(out_csv),
        "--json",
        str(out_json),
        "-q",
        nvml_lib=lib,
    )
    assert rc == 0
    data = rows(out_csv)
    assert {r["gpu0_util_pct"] for r in data} == {"30.0000"}
    assert {r["gpu0_power_w"] for r in data} == {""}  # NOT_SUPPORTED -> empty, the rest still there
    assert float(data[0]["gpu0_mem_used_gib"]) == 4.0 and data[0]["gpu0_procs"] == "1"
    f = {x["id"]: x for x in json.loads(out_json.read_text())["findings"]}
    low = f["monitor.gpu_low_util"]
    assert low["severity"] == "warn" and low["fix_code"].startswith("pitstop profile --")
    assert low["data"]["mean_util_pct"] == 30 and "4242" in low["evidence"]
    assert lib.calls["shutdown"] == 1


def test_busy_gpu_passes_and_lost_gpu_is_reported(tmp_path):
    out = tmp_path / "b.json"
    assert (
        monitor(
            "--interval",
            "0.05",
            "--duration",
            "0.2",
            "--window",
            "0.1",
            "--json",
            str(out),
            "-q",
            nvml_lib=fake_pynvml(util=95),
        )
        == 0
    )
    f = {x["id"]: x for x in json.loads(out.read_text())["findings"]}
    assert f["monitor.gpu_low_util"]["severity"] == "pass"
    assert (
        monitor(
            "--interval",
            "0.05",
            "--duration",
            "0.2",
            "--json",
            str(out),
            "-q",
            nvml_lib=fake_pynvml(fail_after=2),
        )
        == 0
    )
    f = {x["id"]: x for x in json.loads(out.read_text())["findings"]}
    assert f["monitor.gpu"]["severity"] == "warn" and "mid-run" in f["monitor.gpu"]["evidence"]


def _sample(t, util, pids=(1,), alive=None):
    g = GpuSample(0, util, 10.0, GIB, 8 * GIB, 100.0, 50.0, 1000, 2000, list(pids))
    return Sample(t, 50.0, [50.0], GIB, 8 * GIB, 0, 0.0, 0.0, 0.0, 0.0, proc_alive=alive, gpus=[g])


def test_rule_needs_a_sustained_window_while_training():
    rule = LowUtilRule(threshold=70, window_s=30, is_training=lambda pid: True)
    for t in range(0, 25):
        rule.update(_sample(float(t), 20))
    rule.update(_sample(25.0, 90))  # breaks the streak before 30 s
    for t in range(26, 50):
        rule.update(_sample(float(t), 20, pids=()))  # low, but nothing is training
    assert rule.findings() == [] and rule.active() == []
    for t in range(50, 90):
        rule.update(_sample(float(t), 40 if t % 2 else 60, pids=(), alive=True))  # the followed command runs
    (f,) = rule.findings(["python", "train.py"])
    assert f.data["seconds"] == 39 and f.data["mean_util_pct"] == 50
    assert f.fix_code == "pitstop profile -- python train.py"
    assert [s.gpu for s in rule.active()] == [0]
    rule.update(_sample(90.0, 70))  # at the threshold is not low
    assert rule.active() == []


def test_rule_ignores_display_servers():
    rule = LowUtilRule(threshold=70, window_s=5, is_training=lambda pid: pid != 1)
    for t in range(10):
        rule.update(_sample(float(t), 5, pids=(1,)))  # only "Xorg" on the GPU
    assert rule.findings() == [] and rule.training_seen == set()
    for t in range(10, 20):
        rule.update(_sample(float(t), 5, pids=(1, 2)))
    assert rule.findings()[0].data["seconds"] == 9


def test_sampler_reads_gpus_through_nvml():
    with Nvml(fake_pynvml(util=55)) as nv:
        s = Sampler(nv).sample()
    assert s.gpus[0].util_gpu_pct == 55 and s.gpus[0].sm_clock_mhz == 1410 and s.gpus[0].processes == [4242]
    assert len(s.cpu_per_core) >= 1 and s.ram_total_bytes > 0


def test_view_shows_gpu_and_alert():
    rule = LowUtilRule(70, 1)
    for t in range(3):
        rule.update(_sample(float(t), 10))
    con = Console(record=True, width=120)
    con.print(render(_sample(2.0, 10), "title [x]", rule.active(), 70, None, ["line [bold]1"]))
    text = con.export_text()
    assert (
        "GPUs (NVML)" in text
        and "under 70% for 2 s" in text
        and "line [bold]1" in text
        and "title [x]" in text
    )


def test_plot_draws_a_png(tmp_path):
    path = tmp_path / "p.csv"
    log = CsvLog(path)
    for t in range(5):
        log.write(_sample(float(t), 20 * t))
    log.close()
    cols = read_csv(path)
    assert cols["gpu0_util_pct"] == [0.0, 20.0, 40.0, 60.0, 80.0]
    png = plot_csv(path)
    assert png == tmp_path / "p.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert monitor("--plot", str(path), "--out", str(tmp_path / "q.png")) == 0
    assert (tmp_path / "q.png").exists()
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(PlotError):
        plot_csv(tmp_path / "bad.csv")
    assert monitor("--plot", str(tmp_path / "missing.csv")) == 2


def test_bad_arguments_exit_2(tmp_path):
    assert monitor("--interval", "0") == 2
    assert monitor("--interval", "0.05", "--", str(tmp_path / "no-such-binary"), nvml_lib=fake_pynvml()) == 2


def test_duration_stops_the_command_with_ctrl_c(tmp_path):
    waits = "import signal, sys\nsignal.signal(signal.SIGINT, lambda *a: sys.exit(7))\nsignal.pause()\n"
    out = tmp_path / "d.json"
    rc = monitor(
        "--interval",
        "0.1",
        "--duration",
        "0.3",
        "--json",
        str(out),
        "-q",
        "--",
        sys.executable,
        "-c",
        waits,
        nvml_lib=SimpleNamespace(nvmlInit=no_driver),
    )
    # stopped by SIGINT: 7 from its handler (1 or 130 if the signal beat the handler on a slow start)
    assert rc in (7, 1, 130)
    f = {x["id"]: x for x in json.loads(out.read_text())["findings"]}
    assert f"command exited with {rc if rc != 130 else -2}" in f["monitor.run"]["evidence"]


def test_live_screen_path(capsys):
    rc = monitor(
        "--interval",
        "0.05",
        "--duration",
        "0.15",
        "--window",
        "0.05",
        nvml_lib=fake_pynvml(util=10),
        live=True,
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert (
        "GPUs (NVML)" in out and "Host (psutil)" in out and "low GPU utilization" in out and "1 warn" in out
    )
