"""Every command: SIGTERM is Ctrl-C (KeyboardInterrupt, exit 130), and a command stopped before it had a
report still leaves the --json it was asked for, saying it was interrupted."""

from __future__ import annotations

import json
import os
import signal
import time

from pitstop.cli import main


def test_sigterm_stops_a_command_like_ctrl_c_and_the_json_says_so(monkeypatch, tmp_path, capsys):
    from pitstop.doctor import cli as doctor_cli

    def terminated(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # the signal ends this at once: no test waits here
        return 0

    monkeypatch.setattr(doctor_cli, "cmd_doctor", terminated)
    out = tmp_path / "d.json"
    before = signal.getsignal(signal.SIGTERM)
    assert main(["doctor", "--json", str(out)]) == 130
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is pitstop's only while it runs
    doc = json.loads(out.read_text())
    assert doc["tool"] == "doctor" and doc["meta"]["interrupted"] and "interrupted" in doc["error"]
    assert "pitstop: interrupted" in capsys.readouterr().err


def test_a_report_the_command_wrote_before_the_stop_is_kept(monkeypatch, tmp_path):
    from pitstop.doctor import cli as doctor_cli

    out = tmp_path / "d.json"

    def wrote_then_stopped(args):
        out.write_text('{"tool": "doctor", "findings": []}')
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor_cli, "cmd_doctor", wrote_then_stopped)
    assert main(["doctor", "--json", str(out)]) == 130
    assert json.loads(out.read_text()) == {"tool": "doctor", "findings": []}


def test_a_stale_report_of_an_earlier_run_is_replaced_by_the_interrupted_one(monkeypatch, tmp_path):
    from pitstop.doctor import cli as doctor_cli

    out = tmp_path / "d.json"
    out.write_text('{"tool": "doctor", "findings": [], "stale": true}')

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor_cli, "cmd_doctor", stopped)
    assert main(["doctor", "--json", str(out)]) == 130
    doc = json.loads(out.read_text())
    assert "stale" not in doc and doc["meta"]["interrupted"]
