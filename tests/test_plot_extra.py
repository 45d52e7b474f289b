"""The [plot] extra: without matplotlib, PNG options say how to install it; no ImportError traceback."""

from __future__ import annotations

import sys

import pytest

from pitstop.cli import main
from pitstop.plotting import PlotUnavailable, matplotlib_agg, unavailable


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError


def test_missing_matplotlib_is_a_message_with_the_install_line(no_matplotlib):
    with pytest.raises(PlotUnavailable, match=r"pitstop\[plot\]"):
        matplotlib_agg()
    assert "pip install 'pitstop[plot]'" in unavailable("--png")


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--png", "x.png", "--budget", "1s"],
        ["monitor", "--plot", "x.csv"],
    ],
)
def test_png_options_exit_2_before_any_work(no_matplotlib, argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "needs matplotlib" in err and "pitstop[plot]" in err and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()


def test_with_matplotlib_nothing_is_reported():
    pytest.importorskip("matplotlib")
    assert unavailable("--png") is None
