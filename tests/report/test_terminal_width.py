"""The terminal report at any width: ids, costs and file:line whole; passes listed with their numbers."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from pitstop.findings import Finding, Report, Severity
from pitstop.profile.analyze.pass_rules import skipped_probe_passes
from pitstop.report.terminal import print_report

LONG_WHERE = "src/very/deeply/nested/package/with/a/long/path/to/the/training/entry_point_module.py:1234"


def report() -> Report:
    return Report(
        tool="profile",
        findings=[
            Finding(
                id="dataloader.workers",
                severity=Severity.WARN,
                title="Training waits for data: the DataLoader has fewer workers than cores",
                evidence="data wait 974.4 ms per step, 82% of the 1183.3 ms step, over 10 steps",
                fix="Load batches in 2 worker processes.",
                fix_code="DataLoader(..., num_workers=2, persistent_workers=True, prefetch_factor=4, pin_memory=True)",
                location="examples/slow_loader.py:58",
                est_saving_s=0.9744,
                share=0.82,
            ),
            Finding(
                id="memory_format.channels_last",
                severity=Severity.WARN,
                title="The conv net runs in NCHW [fast] here",
                evidence="NCHW 306.2 ms, channels_last 117.8 ms",
                location=LONG_WHERE,
                est_saving_s=0.1884,
                share=0.16,
            ),
            Finding(
                id="memory_format.channels_last_3d",
                severity=Severity.PASS,
                title="channels_last measured no faster than NCHW for this model",
                evidence="NCHW 12.0 ms, channels_last 14.5 ms",
            ),
        ],
    )


def render(width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    print_report(report(), console)
    return console.export_text()


@pytest.mark.parametrize("width", [60, 80, 100])
def test_narrow_terminals_show_id_cost_and_location_whole(width):
    text = render(width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines)
    assert "…" not in text
    for whole in (
        "dataloader.workers",
        "memory_format.channels_last",
        "974 ms/step (82%)",
        "examples/slow_loader.py:58",
    ):
        assert any(whole in line for line in lines), whole
    assert LONG_WHERE in text.replace("\n", "")  # longer than the terminal: folded, not cut
    assert "[fast]" in text  # user strings are not markup
    assert "    DataLoader(..., num_workers=2" in text  # the snippet on its own indented line


def test_wide_terminals_keep_the_table_with_whole_ids():
    text = render(140)
    assert "┃" in text and "…" not in text
    lines = text.splitlines()
    for whole in (
        "dataloader.workers",
        "memory_format.channels_last",
        "974 ms/step (82%)",
        "examples/slow_loader.py:58",
    ):
        assert any(whole in line for line in lines), whole


def test_passes_are_listed_under_the_summary_with_their_numbers():
    text = render(80)
    tail = text[text.index("checks:") :]
    assert "Checked, no gain here:" in tail
    assert "memory_format.channels_last_3d" in tail and "NCHW 12.0 ms, channels_last 14.5 ms" in tail.replace(
        "\n", " "
    )


def test_a_skipped_precision_probe_is_a_pass_that_says_why():
    probes = {"precision": {"dtype": None, "skipped": "no fast bf16/fp16 path on this cpu"}}
    (f,) = skipped_probe_passes(probes, "cpu")
    assert f.id == "precision.amp" and f.severity is Severity.PASS
    assert "no fast bf16/fp16 path on this cpu" in f.evidence and "AVX512_BF16" in f.evidence
    assert (
        skipped_probe_passes(
            {"precision": {"dtype": "bfloat16", "base_s": 1, "new_s": 1, "saving_s": 0}}, "cpu"
        )
        == []
    )
    assert skipped_probe_passes({}, "cpu") == []


@pytest.mark.slow
def test_profile_cli_at_80_columns_prints_whole_ids_and_locations(tmp_path, monkeypatch, capsys):
    import sys

    from pitstop.cli import main

    script = tmp_path / "a_training_script_with_a_long_name.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(8, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(100):\n"
        "    loss = model(torch.randn(16, 8)).pow(2).mean()\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    for v in model(torch.randn(256, 8)).detach().flatten():\n"
        "        v.item()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    assert (
        main(["profile", "--steps", "4", "--warmup", "1", "--no-probes", "--", sys.executable, script.name])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    # its cost on the id's line, in whichever unit reads best (us, ms or s on a loaded machine)
    assert any(re.search(r"sync\.item\s+[\d.]+ (us|ms|s)/step", line) for line in lines)
    assert any(line.endswith("a_training_script_with_a_long_name.py:10") for line in lines)


@pytest.mark.parametrize("width", [80, 140])
def test_the_run_s_verdict_heads_the_report(width, tmp_path):
    from pitstop.report.html import render_html

    unsure = Finding(
        id="dataloader.workers",
        severity=Severity.INFO,
        title="Training waits for data",
        est_saving_s=0.136,
        share=0.38,
        data={"confirmed": False, "saving_ci_s": [-0.6, 0.2]},
    )
    verdict = Finding(
        id="summary.unconfirmed",
        severity=Severity.INFO,
        title="Nothing confirmed at 5% of the step, but 1 larger estimate was not confirmed <b>",
    )
    rep = Report(tool="profile", findings=[unsure, verdict])
    console = Console(width=width, record=True, color_system=None)
    print_report(rep, console)
    text = console.export_text()
    assert text.index("summary.unconfirmed") < text.index("dataloader.workers")
    html = render_html(rep)
    assert "<p class='verdict'><b>Nothing confirmed at 5% of the step" in html and "&lt;b&gt;" in html
    assert html.index("class='verdict'") < html.index("id='findings'")


def test_passes_are_shown_once_counted_for_checks_listed_for_measurements():
    rep = report()
    rep.findings.append(Finding(id="system.file_max", severity=Severity.PASS, title="System-wide open files"))

    def text(**kw) -> str:
        console = Console(width=80, record=True, color_system=None)
        print_report(rep, console, **kw)
        return console.export_text()

    listed = text()  # profile, bench: a pass is a measured "no gain", one line each under the counts
    assert listed.count("channels_last_3d") == 1 and "Checked, no gain here" in listed
    counted = text(passes="count")  # doctor, sysctl: the problems and a count of passes
    assert "channels_last_3d" not in counted and "system.file_max" not in counted
    footer = counted[counted.index("4 checks") :]
    assert "WARN  dataloader.workers" in footer and "WARN  memory_format.channels_last:" in footer
    assert "2 checks passed (--all lists them)" in footer
    every = text(passes="all")  # --all: every row once, in the body
    assert every.count("system.file_max") == 1 and "Checked, no gain" not in every
    assert every.index("system.file_max") < every.index("4 checks")
    assert all(len(line) <= 80 for line in (listed + counted + every).splitlines())
