"""Output paths (--json, --html, --png, --plot, --out-dir ...) are checked before a command runs: one that
cannot be written exits 2 with one line, before anything is measured or the script is started."""

from __future__ import annotations

import pytest

from pitstop.cli import main
from pitstop.cliopts import output_problem

UNWRITABLE = "/proc/pitstop-no/x"  # procfs takes no new files, not even from root


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor", "--json", "/proc/x.json"],
        ["profile", "--html", "/proc/x.html", "--", "python", "{script}"],
        ["profile", "--out-dir", UNWRITABLE, "--", "python", "{script}"],
        ["tune", "lr", "--plot", "/proc/x.png", "--", "python", "{script}"],
        ["tune", "batch-size", "--json", "/proc/x.json", "--", "python", "{script}"],
        ["fix", "--out-dir", UNWRITABLE, "--", "python", "{script}"],
        ["bench", "--png", "/proc/x.png"],
        ["compare", "a.json", "b.json", "--json", "/proc/x.json"],
        ["monitor", "--csv", "/proc/x.csv", "--", "python", "{script}"],
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_an_unwritable_output_exits_2_with_one_line_before_running(argv, tmp_path, capsys):
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    code = main([a.format(script=script) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("pitstop: cannot write") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert not marker.exists()  # nothing ran


def test_what_a_path_problem_says(tmp_path):
    (tmp_path / "file").write_text("keep")
    assert output_problem(tmp_path, "file") == "it is a directory"
    assert output_problem(tmp_path / "file", "dir") == "it is not a directory"
    assert "not a directory" in (output_problem(tmp_path / "file" / "x.json") or "")
    assert output_problem("/proc/x.html") is not None


def test_writable_paths_pass_and_are_left_as_they_were(tmp_path):
    existing = tmp_path / "old.json"
    existing.write_text("keep")
    assert output_problem(existing) is None and existing.read_text() == "keep"
    nested = tmp_path / "a" / "b" / "r.json"
    assert output_problem(nested) is None and output_problem(tmp_path / "new-dir", "dir") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # no probe file or folder left


def test_json_to_stdout_is_not_a_path(capsys):
    from pitstop.cli import build_parser
    from pitstop.cliopts import check_outputs

    assert check_outputs(build_parser().parse_args(["doctor", "--json", "-"])) is None
