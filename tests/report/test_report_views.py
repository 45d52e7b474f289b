"""The profile report read at a glance, on the terminal (80 columns) and in the HTML: the headline states
the largest measured part of the step first, costs in cost order with 2-3 significant digits, one
statistic per view (the step bar is the mean), charts with real axes, warm-up marked, one order of
findings everywhere."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from pitstop.findings import Finding, Report, Severity
from pitstop.profile.analyze.headline import headline
from pitstop.profile.present.render import html_blocks, print_breakdown
from pitstop.report.html import render_html, ticks
from pitstop.report.terminal import print_report


def _step(i: int, warm: bool) -> dict:
    wait = 0.9 if not warm else 1.6
    return {
        "index": i,
        "total_s": wait + 0.1 + 0.002 * i,
        "data_wait_s": wait,
        "h2d_s": 0.0,
        "forward_s": 0.04,
        "backward_s": 0.05,
        "optimizer_s": 0.01,
        "sync_s": 0.0,
        "other_s": 0.002 * i,
        "warmup": warm,
    }


def profile_report() -> Report:
    steps = [_step(i, i < 3) for i in range(10)]
    measured = [s for s in steps if not s["warmup"]]
    mean = sum(s["total_s"] for s in measured) / len(measured)
    bd = {p: sum(s[p] for s in measured) / len(measured) for p in measured[0] if p.endswith("_s")}
    bd.update(steps=len(measured), mean_step_s=mean, median_step_s=0.5979, boundary="optimizer.step()")
    findings = [
        Finding(  # ranks above the larger cost: it warns (confirmed), the larger one is info
            id="memory_format.channels_last",
            severity=Severity.WARN,
            title="The conv net runs in NCHW",
            est_saving_s=0.06516,
            share=0.06516 / mean,
            data={"confirmed": True, "saving_ci_s": [0.055, 0.07]},
        ),
        Finding(
            id="dataloader.workers",
            severity=Severity.INFO,
            title="Training waits for data",
            est_saving_s=0.9,
            share=0.9 / mean,
            data={"confirmed": False, "saving_ci_s": None},
        ),
        Finding(
            id="summary.unconfirmed", severity=Severity.INFO, title="1 larger estimate was not confirmed"
        ),
        Finding(id="precision.amp", severity=Severity.PASS, title="fp32 is as fast"),
    ]
    losses = [2.31, 2.29, 2.30, 2.27, 2.26, 2.27, 2.25]
    return Report(
        tool="profile", findings=findings, sections={"breakdown": bd, "steps": steps, "losses": losses}
    )


def _section(html: str, heading: str) -> str:
    start = html.index(heading)
    return html[start : html.index("</section>", start)]


def test_headline_states_the_largest_part_then_the_largest_cost_then_what_is_confirmed():
    lines = headline(profile_report())
    assert lines[0] == "Data wait is 89% of the step: 900 ms of the 1.01 s mean over 7 measured steps."
    assert lines[1].startswith("Largest finding: dataloader.workers costs 900 ms a step, 89% of the step")
    assert "not confirmed" in lines[1]
    assert lines[2] == "Confirmed: memory_format.channels_last (65.2 ms a step)."


def test_html_costs_in_cost_order_and_significant_digits():
    rep = profile_report()
    html = render_html(rep, html_blocks(rep))
    bars = _section(html, "What each finding costs per step")
    assert bars.index("dataloader.workers") < bars.index("memory_format.channels_last")
    assert "0.06516" not in html and "65.2 ms/step (6%)" in _section(html, "<h2>Findings")
    # the headline before the counts, the summary first in the findings table as on the terminal
    assert html.index("Data wait is 89% of the step") < html.index("4 findings:")
    assert re.findall(r'data-id="([^"]+)"', html)[0] == "summary.unconfirmed"


def test_html_one_statistic_per_view_and_real_axes():
    rep = profile_report()
    html = render_html(rep, html_blocks(rep))
    bar = _section(html, "Where a step goes")
    assert "mean of 7 measured steps, 1.01 s" in bar and "median" not in bar and "598" not in bar
    per_step = _section(html, "Per-step time")
    yticks = re.findall(r'class="ytick"[^>]*>([^<]+)<', per_step)
    assert len(yticks) >= 4 and yticks[0] == "0"
    assert re.findall(r'class="xtick"[^>]*>([^<]+)<', per_step)[:2] == ["0", "2"]
    assert 'class="shade"' in per_step and ">warm-up<" in per_step
    loss_ticks = [float(v) for v in re.findall(r'class="ytick"[^>]*>([^<]+)<', _section(html, "Loss per"))]
    assert 2.2 <= loss_ticks[0] <= 2.25 and loss_ticks[-1] >= 2.31  # spans the losses, not from 0


def test_html_step_timeline_and_what_if():
    rep = profile_report()
    html = render_html(rep, html_blocks(rep))
    timeline = _section(html, "Step timeline")
    assert len(re.findall(r'class="track"', timeline)) == 10
    assert timeline.count("(warm-up)") == 3
    assert "step 4: data wait 900 ms" in timeline
    what = _section(html, "What if")
    assert what.index("as measured") < what.index("dataloader.workers fixed")
    assert "dataloader.workers fixed" in what and "; not confirmed" in what
    assert "memory_format.channels_last fixed" in what and "; confirmed" in what
    assert what.count('class="whatif"') == 3


def test_terminal_at_80_columns_heads_with_the_headline_and_the_mean():
    rep = profile_report()
    console = Console(width=80, record=True, color_system=None)
    print_breakdown(rep, console)
    print_report(rep, console)
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert text.startswith("Data wait is 89% of the step")
    assert (
        "mean step 1.01 s over 7 measured steps" in text and "median" not in text.split("pitstop profile")[0]
    )
    table = text[text.index("pitstop profile") :]
    assert table.index("summary.unconfirmed") < table.index("memory_format.channels_last")
    assert "65.2 ms/step (6%)" in text and "0.06516" not in text


def test_durations_and_rates_read_at_a_glance():
    from pitstop.units import duration, sig3

    assert [duration(v) for v in (0.06516, 5.3109, 0.0000423, 0.9997, 123.4)] == [
        "65.2 ms",
        "5.31 s",
        "42.3 us",
        "1 s",
        "123 s",
    ]
    assert [sig3(v) for v in (0.16743, 15.12, 2325.6)] == ["0.167", "15.1", "2,326"]


def test_ticks_are_round_and_enclose_the_range():
    assert ticks(0, 12, whole=True) == [0, 5, 10, 15]
    assert ticks(1.36, 1.45) == [1.36, 1.38, 1.4, 1.42, 1.44, 1.46]
    assert ticks(0, 6497)[-1] == 8000


def test_tensorboard_export_without_the_package_is_one_clear_line(monkeypatch, capsys, tmp_path):
    import sys

    from pitstop.cli import main
    from pitstop.profile.present.tensorboard import unavailable

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were absent
    assert "pip install" in (unavailable() or "")
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    assert main(["profile", "--tensorboard", str(tmp_path / "tb"), "--", sys.executable, str(script)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--tensorboard needs tensorboard: pip install" in err
    assert not (tmp_path / "tb").exists()


def test_tensorboard_export_writes_the_breakdown_and_the_findings(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pitstop.profile.present.tensorboard import write_tensorboard

    write_tensorboard(profile_report(), tmp_path / "tb")
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    wait = acc.Scalars("pitstop/step_ms/data_wait")
    assert [e.step for e in wait] == list(range(10)) and wait[5].value == pytest.approx(900.0)
    assert [e.value for e in acc.Scalars("pitstop/warmup")][:4] == [1.0, 1.0, 1.0, 0.0]
    assert acc.Scalars("pitstop/mean_step_ms/total")[0].value == pytest.approx(1008.0, rel=0.01)
    assert acc.Scalars("pitstop/finding_cost_ms/dataloader.workers")[0].value == pytest.approx(900.0)
    assert "pitstop/finding_cost_ms/memory_format.channels_last" in scalars
    texts = acc.Tags()["tensors"]
    assert "pitstop/headline/text_summary" in texts and "pitstop/findings/text_summary" in texts
    table = acc.Tensors("pitstop/findings/text_summary")[0].tensor_proto.string_val[0].decode()
    assert table.index("`summary.unconfirmed`") < table.index("`dataloader.workers`")
    assert "| 900 ms/step (89%) |" in table
