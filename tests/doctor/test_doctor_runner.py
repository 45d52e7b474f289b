from __future__ import annotations

import argparse
import json

import jsonschema
import pytest

from pitstop.doctor import runner
from pitstop.doctor.cli import register
from pitstop.doctor.runner import DoctorOptions, run_doctor
from pitstop.findings import Severity
from pitstop.report.jsonfmt import load_schema, to_json


def _cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pitstop")
    register(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args)


def _fake_opts(tmp_path, build, nvml, **kw) -> DoctorOptions:
    """Everything the doctor reads points into an empty tmp tree: every file is missing or unreadable."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.bin").write_bytes(b"z" * 2**20)
    return DoctorOptions(
        data_path=tmp_path / "data",
        allow_write=False,
        nvml_lib=nvml,
        build=build,
        env={"NCCL_SOCKET_IFNAME": "ib"},
        sys_root=str(tmp_path / "sys"),
        proc_root=str(tmp_path / "proc"),
        root=str(tmp_path),
        **kw,
    )


def test_gpu_machine_with_empty_sys_and_proc(tmp_path, build_factory, fake_nvml):
    """The GPU path end to end, with fake NVML and torch build and unreadable /sys and /proc: every probe
    reports, none crashes."""
    report = run_doctor(_fake_opts(tmp_path, build_factory(), fake_nvml))
    ids = {f.id for f in report.findings}
    assert not [f for f in report.findings if f.id.endswith("probe_failed")], report.findings
    for fid in ("gpu.presence", "gpu.model", "gpu.pcie", "gpu.persistence", "cuda.build", "cuda.driver_compat",
                "cuda.arch", "cuda.tf32", "memory.ram", "memory.shm", "storage.read_speed", "system.nccl_env"):  # fmt: skip
        assert fid in ids, fid
    assert report.by_id("gpu.presence").severity is Severity.PASS
    assert report.by_id("memory.ram").severity is Severity.WARN  # /proc/meminfo unreadable
    assert report.by_id("system.nccl_env").severity is Severity.WARN  # no interface matches "ib"
    assert all(f.evidence for f in report.findings)
    jsonschema.validate(json.loads(to_json(report)), load_schema())


def test_failing_probe_becomes_a_finding(tmp_path, build_factory, fake_nvml, monkeypatch):
    def boom(*a, **k):
        raise ValueError("unexpected /sys format")

    monkeypatch.setattr(runner.memory, "check_thp", boom)
    report = run_doctor(_fake_opts(tmp_path, build_factory(), fake_nvml))
    f = report.by_id("memory.probe_failed")
    assert f is not None and f.severity is Severity.ERROR
    assert "thp" in f.title and "ValueError: unexpected /sys format" in f.evidence
    assert report.by_id("memory.shm") is not None  # the others still ran


def test_interrupt_keeps_what_was_measured(tmp_path, build_factory, fake_nvml, monkeypatch):
    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.storage, "check_path", interrupt)
    report = run_doctor(_fake_opts(tmp_path, build_factory(), fake_nvml))
    assert report.meta["interrupted"] and "interrupted" in report.error
    assert report.by_id("gpu.presence") is not None and report.by_id("system.kernel") is None


def test_broken_torch_is_a_finding(tmp_path, fake_nvml, monkeypatch):
    def no_torch():
        raise ImportError("libtorch_cpu.so: cannot open shared object file")

    monkeypatch.setattr(runner, "read_torch_build", no_torch)
    opts = _fake_opts(tmp_path, None, fake_nvml)
    report = run_doctor(opts)
    assert report.by_id("python.torch").severity is Severity.ERROR
    assert report.by_id("python.version") is not None and report.by_id("memory.ram") is not None
    assert "torch not importable" in report.by_id("gpu.presence").evidence
    assert not [f for f in report.findings if f.id.endswith("probe_failed")]


def test_missing_data_path_is_a_finding_not_a_crash(tmp_path, build_factory, fake_nvml):
    opts = _fake_opts(tmp_path, build_factory(), fake_nvml)
    opts.data_path = tmp_path / "no" / "such"
    report = run_doctor(opts)
    assert report.by_id("storage.path").severity is Severity.ERROR
    assert report.by_id("storage.read_speed") is None


def test_inventory_rows_come_from_finding_data(tmp_path, build_factory, fake_nvml):
    report = run_doctor(_fake_opts(tmp_path, build_factory(), fake_nvml))
    facts = report.sections["doctor"]["facts"]
    assert {"area": "cuda", "check": "cuda.build", "fact": "torch", "value": "2.5.1+cu124"} in facts
    assert all(set(r) == {"area", "check", "fact", "value"} for r in facts)
    assert "storage.read_speed" in report.sections["doctor"]["probe_seconds"]
    glance = dict(report.sections["doctor"]["inventory"])
    assert glance["GPU"] == "NVIDIA A100-SXM4-40GB (40.0 GiB)"
    assert glance["NVIDIA driver"] == "550.54.15 (CUDA 12.4)" and glance["cuDNN"] == "9.1.0"
    assert glance["torch"] == "2.5.1+cu124 (CUDA 12.4)" and glance["NCCL"] == "2.21.5"
    assert "MB/s" in glance["Sequential read"]


@pytest.mark.slow
def test_real_doctor_here_json_and_html(tmp_path):
    """The acceptance check: the real audit of this machine, through the CLI."""
    data = tmp_path / "d<b>ata"
    data.mkdir()
    (data / "shard.bin").write_bytes(b"\0" * 2**20)
    out, page = tmp_path / "out.json", tmp_path / "doctor.html"
    code = _cli(
        [
            "doctor",
            "--data",
            str(data),
            "--json",
            str(out),
            "--html",
            str(page),
            "-q",
            "--read-seconds",
            "0.5",
        ]
    )
    assert code == 0
    d = json.loads(out.read_text())
    jsonschema.validate(d, load_schema())
    findings = d["findings"]
    assert len(findings) >= 25, [f["id"] for f in findings]
    assert {f["area"] for f in findings} >= {"gpu", "cuda", "cpu", "memory", "storage", "system", "python"}
    assert all(f["evidence"].strip() for f in findings), [f["id"] for f in findings if not f["evidence"]]
    assert not [f["id"] for f in findings if f["id"].endswith("probe_failed")]
    assert d["summary"]["total"] == len(findings)
    # no GPU here: the CUDA build on a CPU-only machine is named, with the CPU wheel command
    ids = {f["id"]: f for f in findings}
    if ids["gpu.presence"]["data"]["nvml_gpus"] == 0 and ids["cuda.build"]["data"]["cuda_runtime"]:
        assert "download.pytorch.org/whl/cpu" in ids["cuda.build"]["fix_code"]
    assert ids["storage.read_speed"]["data"]["mb_per_s"] > 0
    html = page.read_text()
    assert "Machine inventory" in html and "d&lt;b&gt;ata" in html and "d<b>ata" not in html
    assert d["meta"]["seconds"] > 0  # wall time is recorded, not asserted (shared machines vary)


def test_bad_read_seconds_is_a_usage_error(capsys):
    assert _cli(["doctor", "--read-seconds", "0"]) == 2


def test_json_to_stdout_is_pure_json_and_strict_exit(tmp_path, capsys):
    """`--json -` prints only JSON; a missing --data is an error finding, exit 1 under --strict, no traceback."""
    code = _cli(["doctor", "--data", str(tmp_path / "missing"), "--json", "-", "--strict"])
    out = capsys.readouterr().out
    d = json.loads(out)
    assert code == 1
    f = next(f for f in d["findings"] if f["id"] == "storage.path")
    assert f["severity"] == "error" and "does not exist" in f["title"]
    (tmp_path / "x").write_bytes(b"1" * 4096)
    assert _cli(["doctor", "--data", str(tmp_path), "--no-write", "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    speed = next(f for f in d["findings"] if f["id"] == "storage.read_speed")
    assert speed["data"]["temp_file"] is False and "rough" in speed["evidence"]  # 4 KiB file, nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]
