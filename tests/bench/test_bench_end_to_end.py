import json

import jsonschema
import pytest
import torch

from pitstop.bench.results import COLUMNS, findings, html_blocks, markdown, table_rows, to_report, write_png
from pitstop.bench.rows import MEASURED, SKIPPED
from pitstop.bench.runner import BenchOptions, run_bench
from pitstop.cli import main
from pitstop.report.html import render_html
from pitstop.report.jsonfmt import load_schema, to_json

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_result():
    opts = BenchOptions(
        workload="tabular",
        size="tiny",
        budget_s=120,
        repeats=2,
        warmup=1,
        steps=2,
        threads=1,
        peers=False,
        compile=False,
        ddp_procs=0,
        schedules=False,
        workers=1,
    )
    return run_bench(opts)


def test_tiny_bench_measures_every_row_that_can_run(tiny_result):
    rows = {r.name: r for r in tiny_result.rows}
    assert tiny_result.rows[0].name == "baseline"
    for name in ("baseline", "workers", "amp_bf16", "fused", "checkpoint", "accumulation", "all"):
        r = rows[name]
        assert r.status == MEASURED, (name, r.reason)
        assert len(r.block_step_s) == 2 and all(t > 0 for t in r.block_step_s)
        assert r.steps_per_block == 2 and len(r.warmup_s) == 1
        assert r.peak_mem_bytes is not None and r.peak_mem_bytes > 0
    for name in ("pin_memory", "amp_fp16"):
        assert rows[name].status == SKIPPED and "CUDA" in rows[name].reason
        assert rows[name].samples_per_s is None
    assert "channels_last" not in rows  # not an image workload
    assert tiny_result.flops_per_sample and tiny_result.flops_per_sample > 0
    assert set(tiny_result.peaks) >= {"float32"}


def test_ratios_are_recomputable_from_the_rows(tiny_result):
    rows = {r.name: r for r in tiny_result.rows}
    base = rows["baseline"]
    # throughput: the blocks' samples over their seconds
    assert base.samples_per_s == pytest.approx(base.samples_per_step * 2 / sum(base.block_step_s))
    for r in tiny_result.rows:
        if r.status != MEASURED or r is base:
            continue
        assert r.ref == "baseline"
        assert r.ref_samples_per_s == pytest.approx(base.samples_per_s)
        assert r.speedup == pytest.approx(r.samples_per_s / base.samples_per_s)
        assert r.memory_ratio == pytest.approx(r.peak_mem_bytes / base.peak_mem_bytes)
        assert r.model_flops_per_s == pytest.approx(r.samples_per_s * tiny_result.flops_per_sample)
        peak = tiny_result.peaks.get(r.dtype) or tiny_result.peaks["float32"]
        assert r.peak_fraction == pytest.approx(r.model_flops_per_s / peak)


def test_table_and_report_structure(tiny_result, tmp_path):
    table = table_rows(tiny_result)
    assert len(table) == len(tiny_result.rows)
    assert all(len(row) == len(COLUMNS) for row in table)
    by_title = {row[0]: row for row in table}
    amp = next(r for r in tiny_result.rows if r.name == "amp_bf16")
    assert by_title[amp.title][2] == amp.samples_per_s
    assert by_title[amp.title][4].startswith(f"{amp.speedup:.2f}x")
    assert "claim 2-3x, measured" in by_title[amp.title][-1]

    report = to_report(tiny_result)
    d = json.loads(to_json(report))
    jsonschema.validate(d, load_schema())
    ids = {f["id"] for f in d["findings"]}
    assert {"bench.amp_bf16", "bench.amp_bf16_memory", "bench.checkpoint", "bench.amp_fp16"} <= ids
    assert d["sections"]["bench"]["columns"] == list(COLUMNS)
    assert len(d["sections"]["bench"]["rows"]) == len(tiny_result.rows)
    base = tiny_result.rows[0]
    mem = next(f for f in d["findings"] if f["id"] == "bench.amp_bf16_memory")
    assert mem["data"]["measured"] == pytest.approx(amp.activation_bytes / base.activation_bytes)
    fp16 = next(f for f in findings(tiny_result) if f.id == "bench.amp_fp16")
    assert "not measured" in fp16.evidence

    html = render_html(report, html_blocks(tiny_result))
    assert "Ablation (measured in this run)" in html and "<script" not in html
    md = markdown(tiny_result)
    assert md.count("\n|") >= len(tiny_result.rows)
    png = write_png(tiny_result, tmp_path / "bench.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_runs_end_to_end_and_writes_outputs(tmp_path, capsys):
    out = tmp_path / "b.json"
    code = main(
        ["bench", "--workload", "tabular", "--size", "tiny", "--steps", "1", "--repeats", "1", "--warmup", "1",
         "--threads", "1", "--only", "amp_bf16", "--no-peers", "--no-compile", "--no-schedules", "--ddp", "0",
         "--json", str(out), "--html", str(tmp_path / "b.html"), "--markdown", str(tmp_path / "b.md"), "-q"]
    )  # fmt: skip
    assert code == 0
    d = json.loads(out.read_text())
    names = [r["name"] for r in d["sections"]["bench"]["rows"]]
    assert names == ["baseline", "amp_bf16"]
    assert "<table" in (tmp_path / "b.html").read_text()
    assert (tmp_path / "b.md").read_text().startswith("| config |")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "soon"], "bad --budget"),
        (["--only", "warp_drive"], "unknown config"),
        (["--model", "no_such_module_xyz:make", "--no-compile"], "--model"),
        (["--repeats", "0"], "at least 1"),
        (["--model", "torch.nn:Identity", "--batch-size", "3"], "failed one forward/backward"),
    ],
)
def test_cli_bad_input_is_a_usage_error(args, message, capsys):
    code = main(
        ["bench", "--workload", "tabular", "--size", "tiny", "-q", "--ddp", "0", "--threads", "1", *args]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_user_model_factory(tmp_path):
    f = tmp_path / "mymodel.py"
    f.write_text(
        "import torch\ndef make():\n    return torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))\n"
    )
    opts = BenchOptions(workload="tabular", size="tiny", model=f"{f}:make", steps=1, repeats=1, warmup=1, threads=1,
                        only=("fused",), peers=False, compile=False, ddp_procs=0, schedules=False)  # fmt: skip
    res = run_bench(opts)
    assert [r.status for r in res.rows] == [MEASURED, MEASURED]
    assert res.flops_per_sample == 6 * 16 * 4 + 4 * 32 * 16  # input grads skipped for the first layer


@pytest.mark.slow
def test_vision_peers_and_channels_last_on_real_jpegs(tmp_path):
    opts = BenchOptions(workload="vision", size="tiny", steps=1, repeats=2, warmup=1, threads=1,
                        only=("channels_last", "lightning", "accelerate"), compile=False, ddp_procs=0,
                        schedules=False, data_dir=str(tmp_path))  # fmt: skip
    res = run_bench(opts)
    rows = {r.name: r for r in res.rows}
    assert list(rows) == ["baseline", "channels_last", "lightning", "accelerate"]
    for r in rows.values():
        assert r.status == MEASURED, (r.name, r.reason)
        assert len(r.block_step_s) == 2
    assert rows["lightning"].peak_mem_bytes is None  # Lightning owns its loop: no memory probe
    assert rows["accelerate"].activation_bytes is not None
    assert rows["lightning"].speedup == pytest.approx(
        rows["lightning"].samples_per_s / rows["baseline"].samples_per_s
    )
    assert len(list(tmp_path.glob("class_*/*.jpg"))) == 32  # the generated ImageFolder, kept where asked


def test_interrupt_keeps_what_was_measured():
    class StopAfter:
        def __init__(self, n):
            self.n = n

        def set_total(self, total):
            pass

        def advance(self, description):
            self.n -= 1
            if self.n == 0:
                raise KeyboardInterrupt

    opts = BenchOptions(workload="tabular", size="tiny", steps=1, repeats=3, warmup=1, threads=1,
                        only=("fused",), peers=False, compile=False, ddp_procs=0)  # fmt: skip
    # 3 setup units + 2 warm-ups + 3 blocks, then stop during the second repeat
    res = run_bench(opts, StopAfter(3 + 2 + 3))
    assert res.interrupted
    rows = {r.name: r for r in res.rows}
    assert 1 <= len(rows["baseline"].block_step_s) <= 2 and rows["baseline"].status == MEASURED
    assert rows["onecycle"].status == SKIPPED and "interrupted" in rows["onecycle"].reason
    assert to_report(res).error.startswith("interrupted")


def test_budget_scales_steps_after_an_untimed_calibration():
    opts = BenchOptions(workload="tabular", size="tiny", budget_s=90, repeats=2, warmup=1, threads=1, max_steps=3,
                        only=("fused",), peers=False, compile=False, ddp_procs=0, schedules=False)  # fmt: skip
    res = run_bench(opts)
    assert 1 <= res.steps <= 3
    for r in res.rows:
        assert r.status == MEASURED
        assert r.steps_per_block == res.steps
        assert len(r.block_step_s) == 2  # the calibration block is not a result
