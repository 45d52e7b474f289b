"""The interval plot escapes its labels and draws unbounded intervals to the axis edge."""

from __future__ import annotations

import math

from pitstop.report.intervals import interval_chart


def test_interval_chart_rows_escaping_and_unbounded_ends():
    b = interval_chart(
        "Speed-up <x>",
        [("<script>a</script>", 1.2, 1.1, 1.3, "helped"), ("one round", 0.9, 0.0, math.inf, "undecided")],
        band=0.05,
    )
    assert "<script>" not in b.html and "&lt;script&gt;" in b.html and "Speed-up &lt;x&gt;" in b.html
    assert b.html.count("<circle") == 2 and "stroke-dasharray" in b.html
    assert "inf" not in b.html and "nan" not in b.html
    assert "no interval measured" in interval_chart("t", []).html
