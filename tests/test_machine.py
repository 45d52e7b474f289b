"""pitstop.host.load: the measured context benchmark results carry (load, competing CPU time)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from pitstop.host.load import OtherCpu, load_average, load_line

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
# Double fork: the burner is re-parented away from this process tree, so it is "other work".
DETACHED = (
    "import os, sys\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        exec(sys.argv[1])\n"
    "    os._exit(0)\n"
)


def test_load_line_states_what_was_measured():
    line = load_line(load_average())
    assert line.startswith("load average (1 min) ") and "usable cores" in line


def _background_cpu_s(window: float = 1.0) -> float:
    """Other processes' CPU seconds over ``window`` seconds of this test doing nothing."""
    probe = OtherCpu()
    time.sleep(window)
    return probe.seconds()


def test_own_children_are_not_other_work_but_a_detached_process_is():
    # the test tells 1 s of CPU apart from the machine's other work: it needs a quiet moment
    noise = min(_background_cpu_s() for _ in range(3))
    if noise > 0.25:
        pytest.skip(f"other processes burn {noise:.2f} CPU-s per second here: too busy to tell 1 s apart")
    own = OtherCpu()
    subprocess.run([sys.executable, "-c", BURN.format(s=1.0)], check=True)
    mine = own.seconds()

    other = OtherCpu()
    subprocess.run([sys.executable, "-c", DETACHED, BURN.format(s=1.0)], check=True)
    time.sleep(1.5)  # the burner runs on its own for ~1 s of CPU
    theirs = other.seconds()
    # 1 s burnt by our own child is not charged (beyond background noise); 1 s burnt outside the tree is.
    assert theirs > 0.7, (mine, theirs)
    assert mine < theirs - 0.5, (mine, theirs)
    assert 0.0 <= other.share() <= 1.0
