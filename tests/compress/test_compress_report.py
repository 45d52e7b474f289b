import argparse
import json

import jsonschema
import pytest
import torch

from pitstop.compress import ReportOptions, compress_report, digits
from pitstop.compress.cli import register
from pitstop.compress.render import compress_blocks, rows_table
from pitstop.report.html import render_html
from pitstop.report.jsonfmt import load_schema

FAST = {"min_run_time": 0.02, "latency_rounds": 2, "finetune_steps": 20}


def _rows(report):
    return {r["method"]: r for r in report.sections["compress"]["rows"]}


def test_report_measures_each_method_against_the_baseline(trained_mlp, test_loader):
    methods = ("dynamic_int8", "prune_global", "int8_weight_only", "prune_structured")
    opts = ReportOptions(methods=methods, **FAST)
    report = compress_report(trained_mlp, test_loader, opts, train_loader=digits.train_loader())
    rows = _rows(report)
    assert list(rows) == ["baseline", *methods]
    base, dyn, pr = rows["baseline"], rows["dynamic_int8"], rows["prune_global"]
    assert base["params"] == sum(p.numel() for p in trained_mlp.parameters())
    assert base["size_bytes"] / dyn["size_bytes"] >= 3.0
    assert pr["weight_sparsity"] == pytest.approx(0.5, abs=1e-3)
    assert pr["nonzero_params"] < 0.55 * base["params"]
    st = rows["prune_structured"]  # 30% of channels, removed where exact: a smaller model, not zeros
    assert st["extra"]["channels_removed"] == 2 * round(0.3 * 256)
    assert st["params"] < 0.6 * base["params"] and base["size_bytes"] / st["size_bytes"] > 1.6
    for r in rows.values():
        assert r["applicable"] and not r["error"]
        assert r["latency_b1_s"] > 0 and r["latency_bn_s"] > 0 and r["batch_n"] == 64
        assert r["eval_samples"] == 397 and 0.5 < r["accuracy"] <= 1.0
    ids = {f.id for f in report.findings} - {"compress.latency_noise"}  # depends on machine load
    assert ids == {f"compress.{m}" for m in rows}
    jsonschema.validate(json.loads(json.dumps(report.to_dict())), load_schema())


def test_not_applicable_and_failing_methods_are_rows_with_the_reason(monkeypatch):
    from pitstop.compress import report as report_mod

    real = report_mod.quantize_detailed

    def broken(model, method, *args):
        if method == "static_int8":
            raise RuntimeError("simulated backend failure\nsecond line")
        return real(model, method, *args)

    monkeypatch.setattr(report_mod, "quantize_detailed", broken)
    torch.manual_seed(0)
    model = digits.conv_only().eval()
    data = [(torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))]
    opts = ReportOptions(methods=("dynamic_int8", "static_int8", "distill", "prune_structured"), **FAST)
    report = compress_report(model, data, opts, student=None)
    rows = _rows(report)
    assert not rows["dynamic_int8"]["applicable"] and "Linear/LSTM/GRU" in rows["dynamic_int8"]["reason"]
    assert not rows["distill"]["applicable"] and "student" in rows["distill"]["reason"]
    assert rows["prune_structured"]["applicable"]  # no train data: pruned without fine-tune, said so
    assert "no fine-tune" in rows["prune_structured"]["notes"]
    f = report.by_id("compress.dynamic_int8")
    assert f is not None and f.severity == "info" and "not applicable" in f.title
    assert rows["static_int8"]["error"] == "RuntimeError: simulated backend failure"
    failed = report.by_id("compress.static_int8")
    assert failed.severity == "warn" and "failed" in failed.title
    assert rows["static_int8"]["latency_b1_s"] is None and rows["prune_structured"]["latency_b1_s"] > 0


def test_interrupt_keeps_the_rows_measured_so_far(trained_mlp, test_loader):
    def progress(name, done, total):
        if name == "prune_global":
            raise KeyboardInterrupt

    opts = ReportOptions(methods=("dynamic_int8", "prune_global", "prune_structured"), **FAST)
    report = compress_report(trained_mlp, test_loader, opts, progress=progress)
    assert report.meta["interrupted"] and "interrupted" in report.error
    assert list(_rows(report)) == ["baseline", "dynamic_int8"]
    assert _rows(report)["dynamic_int8"]["size_bytes"] > 0


def test_student_rows_and_rendering_escape_user_strings(trained_mlp, test_loader):
    opts = ReportOptions(methods=("student", "distill"), distill_steps=30, lr=1e-2, **FAST)
    report = compress_report(
        trained_mlp,
        test_loader,
        opts,
        train_loader=digits.few_label_loader(),
        student=digits.student_mlp,
        meta={"model": "<script>alert(1)</script>"},
    )
    rows = _rows(report)
    assert rows["student"]["params"] == rows["distill"]["params"] < rows["baseline"]["params"] / 10
    assert rows["distill"]["extra"]["alpha"] == 0.9 and rows["student"]["extra"]["alpha"] == 0.0
    assert report.by_id("compress.distill").severity in ("pass", "warn")
    page = render_html(report, compress_blocks(report))
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "Compression: baseline vs each method" in page
    assert rows_table(report).row_count == 3


def _cli(argv):
    parser = argparse.ArgumentParser(prog="pitstop")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_bad_specs_and_options_are_usage_errors(capsys):
    assert _cli(["compress", "report", "--model", "no_such_mod:f", "--data", "x:y"]) == 2
    assert "cannot load" in capsys.readouterr().err
    assert _cli(["compress", "report", "--model", "a:b", "--data", "c:d", "--methods", "zip"]) == 2
    assert _cli(["compress", "report", "--model", "a:b", "--data", "c:d", "--prune-amount", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unknown method" in err


def test_cli_report_json_on_a_user_file(tmp_path, capsys):
    work = tmp_path / "work.py"
    work.write_text(
        "import torch\n"
        "from torch.utils.data import TensorDataset\n"
        "def model():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))\n"
        "def data():\n"
        "    g = torch.Generator().manual_seed(0)\n"
        "    return TensorDataset(torch.randn(40, 16, generator=g), torch.randint(0, 4, (40,), generator=g))\n"
    )
    code = _cli(
        ["compress", "report", "--model", f"{work}:model", "--data", f"{work}:data", "--batch", "8",
         "--methods", "dynamic_int8,prune_global", "--min-run-time", "0.02", "--rounds", "1", "--json", "-"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in doc["sections"]["compress"]["rows"]}
    assert set(rows) == {"baseline", "dynamic_int8", "prune_global"}
    assert rows["baseline"]["batch_n"] == 8 and rows["baseline"]["eval_samples"] == 40
    assert doc["tool"] == "compress" and doc["meta"]["model"].endswith("work.py:model")


def _row(method, size, b1, bn, acc, **kw):
    from pitstop.compress import Row

    return Row(
        method, size_bytes=size, latency_b1_s=b1, latency_bn_s=bn, batch_n=64, accuracy=acc, params=100, **kw
    )


@pytest.mark.parametrize(
    ("size", "b1", "bn", "acc", "severity", "in_title"),
    [
        (250, 1.0, 0.5, 0.95, "pass", "4.0x smaller"),  # smaller and faster, accuracy kept
        (250, 3.0, 0.5, 0.95, "info", "0.33-2.00x speed"),  # smaller but slower at batch 1: a trade-off
        (1000, 1.0, 1.0, 0.95, "info", "no size or speed gain"),
        (250, 1.0, 1.0, 0.90, "warn", "accuracy drops 5.0 points"),
    ],
)
def test_severity_follows_the_measured_trade_off(size, b1, bn, acc, severity, in_title):
    from pitstop.compress.report_findings import findings_from_rows

    rows = [_row("baseline", 1000, 1.0, 1.0, 0.95), _row("dynamic_int8", size, b1, bn, acc)]
    f = findings_from_rows(rows, ReportOptions())[1]
    assert f.id == "compress.dynamic_int8" and f.severity == severity and in_title in f.title
    assert (f.fix_code is not None) == (severity != "warn" and "no size" not in in_title)


def test_distill_finding_compares_with_the_student_trained_alone():
    from pitstop.compress.report_findings import findings_from_rows

    base = _row("baseline", 1000, 1.0, 1.0, 0.97)
    alone = _row("student", 50, 0.1, 0.1, 0.80, extra={"alpha": 0.0})
    for acc, severity in ((0.85, "pass"), (0.79, "warn")):
        d = _row("distill", 50, 0.1, 0.1, acc, extra={"alpha": 0.9, "T": 4.0, "steps": 10})
        f = findings_from_rows([base, alone, d], ReportOptions())[2]
        assert f.severity == severity and "80.0%" in f.evidence and "97.0%" in f.evidence
    only = findings_from_rows([base, d], ReportOptions())[1]
    assert only.severity == "info" and "add method 'student'" in only.title


def test_registering_the_command_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, pitstop.compress.cli, pitstop.compress; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_disturbed_latency_is_flagged():
    from pitstop.compress.report_findings import findings_from_rows

    calm = _row("baseline", 1000, 1.0, 1.0, 0.9, extra={"latency_min_s": {"batch_1": 0.9, "batch_n": 0.95}})
    assert findings_from_rows([calm], ReportOptions())[-1].id == "compress.baseline"
    spiky = _row(
        "dynamic_int8", 250, 1.0, 1.0, 0.9, extra={"latency_min_s": {"batch_1": 0.9, "batch_n": 0.1}}
    )
    f = findings_from_rows([calm, spiky], ReportOptions())[-1]
    assert f.id == "compress.latency_noise" and f.severity == "warn"
    assert f.data["method"] == "dynamic_int8" and f.data["ratio"] == pytest.approx(10.0)


def test_a_speed_up_seen_only_in_medians_is_not_a_gain():
    from pitstop.compress.report_findings import findings_from_rows

    mins = {"latency_min_s": {"batch_1": 1.0, "batch_n": 1.0}}
    base = _row("baseline", 1000, 1.0, 1.4, 0.9, extra=mins)  # a load spike inflated the batch-N median
    same = _row(
        "prune_global", 1000, 1.0, 1.0, 0.9, extra={"latency_min_s": {"batch_1": 1.0, "batch_n": 1.02}}
    )
    f = findings_from_rows([base, same], ReportOptions())[1]
    assert f.severity == "info" and "no size or speed gain" in f.title
    real = _row("static_int8", 250, 0.5, 0.5, 0.9, extra={"latency_min_s": {"batch_1": 0.45, "batch_n": 0.5}})
    assert findings_from_rows([base, real], ReportOptions())[1].severity == "pass"
