"""`pitstop profile` on the command line: exit codes, JSON (schema-valid), HTML (escaped, renders in
headless Chromium)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys

import jsonschema
import pytest

from pitstop.profile import cli
from pitstop.report.jsonfmt import load_schema

HOSTILE = "<img src=x onerror=alert(1)>"
SCRIPT = f"""
import torch
from torch import nn
torch.set_num_threads(1)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(1000):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    for v in model(torch.randn(64, 8)).detach().flatten():
        v.item()
    if i == {{fail_at}}:
        raise RuntimeError("{HOSTILE}")
"""


def profile(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub)
    args = parser.parse_args(["profile", *argv])
    return args.func(args)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    ok_script = tmp / "evil<b>name.py"
    ok_script.write_text(SCRIPT.format(fail_at=-1))
    bad_script = tmp / "crash.py"
    bad_script.write_text(SCRIPT.format(fail_at=3))
    out = {}
    for name, script in (("ok", ok_script), ("bad", bad_script)):
        j, h = tmp / f"{name}.json", tmp / f"{name}.html"
        code = profile(
            [
                "--steps",
                "4",
                "--warmup",
                "1",
                "--no-probes",
                "-q",
                "--json",
                str(j),
                "--html",
                str(h),
                "--",
                sys.executable,
                str(script),
            ]
        )
        out[name] = (code, json.loads(j.read_text()), h.read_text(), h)
    return out


@pytest.mark.slow
def test_json_is_schema_valid_with_steps_and_findings(runs):
    code, doc, _, _ = runs["ok"]
    assert code == 0
    jsonschema.validate(doc, load_schema())
    assert doc["tool"] == "profile" and doc["meta"]["status"] == "stopped"
    assert doc["meta"]["measured_steps"] == 4
    assert len(doc["sections"]["steps"]) == 5
    assert doc["findings"][0]["id"] == "sync.item"
    assert doc["findings"][0]["location"].endswith("evil<b>name.py:13")


@pytest.mark.slow
def test_failed_script_exits_1_and_quotes_the_error(runs):
    code, doc, html, _ = runs["bad"]
    assert code == 1
    assert doc["meta"]["status"] == "error"
    assert HOSTILE in doc["error"] and "crash.py" in doc["error"]
    assert doc["sections"]["steps"]  # the steps before the crash are kept
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


@pytest.mark.slow
def test_html_escapes_user_strings_and_has_the_charts(runs):
    _, _, html, _ = runs["ok"]
    assert "evil<b>name" not in html and "evil&lt;b&gt;name" in html
    assert "Where a step goes" in html and "Per-step time" in html and "What if" in html
    assert html.count("<svg") >= 2
    assert 'data-id="sync.item"' in html


def test_usage_errors_exit_2(tmp_path, capsys):
    assert profile([]) == 2
    assert profile(["--", "python", str(tmp_path / "missing.py")]) == 2
    assert "script not found" in capsys.readouterr().err
    assert profile(["--steps", "0", "--", "python", "x.py"]) == 2


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed")
def test_html_renders_in_headless_chromium(runs, tmp_path):
    for name in ("ok", "bad"):
        _, doc, _, path = runs[name]
        cmd = [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / name}",
            "--dump-dom",
            path.resolve().as_uri(),
        ]
        dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
        assert "<h1>pitstop profile</h1>" in dom
        for f in doc["findings"]:
            assert f'data-id="{f["id"]}"' in dom
        assert dom.count("<svg") >= 2 and "<polyline" in dom and "<rect" in dom
        assert "<img" not in dom  # the exception text stayed text
        # the headline above the counts, the step timeline and the charts' axes rendered as elements
        assert dom.index('id="headline"') < dom.index("findings:")
        assert 'id="step-timeline"' in dom and dom.count('class="ytick"') >= 3
        assert 'class="shade"' in dom  # the warm-up step marked
    dom_findings = re.findall(r'data-id="([^"]+)"', runs["ok"][2])
    assert dom_findings[0].startswith("summary.") or "summary" not in {i.split(".")[0] for i in dom_findings}


CTRL_C_SCRIPT = """
import os, time
from pathlib import Path
import torch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(100000):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    if i == 5:
        Path(os.environ["MARKER"]).write_text("ready")
    time.sleep(0.05)
"""

RUN_CLI = (
    "import argparse, sys\n"
    "from pitstop.profile import cli\n"
    "p = argparse.ArgumentParser(); s = p.add_subparsers(); cli.register(s)\n"
    "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))\n"
)


@pytest.mark.slow
def test_ctrl_c_stops_the_script_and_still_writes_the_report(tmp_path):
    import os
    import signal
    import time

    script = tmp_path / "forever.py"
    script.write_text(CTRL_C_SCRIPT)
    marker, report = tmp_path / "ready", tmp_path / "r.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RUN_CLI,
            "profile",
            "--steps",
            "100000",
            "--warmup",
            "1",
            "--no-probes",
            "-q",
            "--json",
            str(report),
            "--",
            sys.executable,
            str(script),
        ],
        env={**os.environ, "MARKER": str(marker)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # polling for the child's marker file, not a synchronisation by sleep
    assert marker.exists(), proc.stderr.read() if proc.poll() is not None else "no marker"
    proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C delivers to pitstop
    assert proc.wait(timeout=60) == 130
    doc = json.loads(report.read_text())
    assert doc["meta"]["status"] == "interrupted" and "interrupted" in doc["error"]
    assert len(doc["sections"]["steps"]) >= 6


@pytest.mark.slow
def test_a_syntax_error_is_quoted_once_without_pitstops_frames(tmp_path, capfd):
    script = tmp_path / "typo.py"
    script.write_text('import torch\nx = (1,\nprint("hi"\n')
    j = tmp_path / "r.json"
    code = profile(["--steps", "2", "--no-probes", "--json", str(j), "--", sys.executable, str(script)])
    assert code == 1
    err = json.loads(j.read_text())["error"]
    assert (
        err.startswith("SyntaxError: '(' was never closed (at ") and "typo.py, line" not in err.split("\n")[0]
    )
    assert f'File "{script}", line 3' in err and "^" in err
    assert "bootstrap.py" not in err and "runpy" not in err and "Traceback" not in err
    shown = capfd.readouterr()
    assert (shown.out + shown.err).count("was never closed") == 2  # the quote and the traceback's last line
