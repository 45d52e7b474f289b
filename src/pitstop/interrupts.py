"""SIGTERM handled as Ctrl-C: ``with sigterm_interrupts():`` makes SIGTERM raise KeyboardInterrupt in the
main thread, so a command stopped by ``kill``, a scheduler or a container runtime ends the way Ctrl-C
ends it (what was measured is reported, exit 130) instead of dying with nothing written. The handler
before it is restored on exit; in another thread (where handlers cannot be set) it does nothing."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        old = signal.signal(signal.SIGTERM, _raise_interrupt)
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)
