import subprocess
import sys

import pytest

from pitstop import __version__
from pitstop.cli import build_parser, main

EXPECTED = {"doctor", "profile", "tune", "fix", "bench", "compress", "launch", "sysctl", "monitor", "compare"}


def test_every_command_is_registered():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) >= EXPECTED


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_usage_error_exits_2():
    r = subprocess.run([sys.executable, "-m", "pitstop", "no-such-command"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
