"""`pitstop fix`'s progress on stderr, as profile and bench show theirs: a bar over the time budget with
the run going now (stage, run number, candidate), and a second line with the round and each candidate's
running speed-up interval (or its verdict once decided). A message starting "pitstop fix: " (how long
it will take, ``pitstop.fix.estimate``) is printed as a line of its own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pitstop.cliutil import progress_bar


@contextmanager
def fix_progress(budget_s: float, show: bool) -> Iterator[Callable[[str], None]]:
    """Yields the ``progress(message)`` callback ``run_fix`` takes. Its round messages (``"<stage>: round
    2/6, ETA 80 s; amp 1.31x [0.92, 1.70]"``) go to the second line, every other one to the first."""
    with progress_bar("[bold]pitstop fix[/bold]", show) as bar:
        run = bar.add_task("starting", total=budget_s)
        rounds = bar.add_task("round 0", total=None)
        start = time.monotonic()

        def update(message: str) -> None:
            if message.startswith("pitstop fix: "):  # the estimate (``estimate``): a line that stays
                if show:
                    bar.console.print(message)
                return
            elapsed = min(budget_s, time.monotonic() - start)
            if message.partition(": ")[2].startswith("round "):
                bar.update(rounds, description=message)
            else:
                bar.update(run, description=message)
            bar.update(run, completed=elapsed)

        yield update
