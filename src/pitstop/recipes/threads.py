"""The intra-op thread count (``torch.set_num_threads``), as one component (``pitstop.recipes.component``)
whose ``SURFACE`` is the process: a process-wide setting whose value is a count, not a switch. All that
pitstop knows and does about it.

torch runs each CPU op on as many threads as it was given (by default one per core it may use); where
other work, the DataLoader's workers or the node's other ranks take cores, fewer threads are faster.
Which command calls which part:

- ``pitstop bench`` (each row's timed block at the bench's thread count): ``scoped``;
- ``pitstop profile --override num_threads=N`` (``Knobs.num_threads``, ``pitstop fix``'s runs, every rank
  of a launch): ``inject`` before the script runs (``pitstop.profile.capture.torchcalls``), which also
  keeps the count where the script sets its own;
- profile's thread probe (``pitstop.profile.probe.thread_probe``, key ``threads``, on the CPU) is judged
  by the contention rules, not ``rulekit.probe_finding`` (``PROBE`` None here, so the device probes'
  loops pass it by: ``applies`` is False); those rules word their fix with ``fix_text``;
- ``pitstop fix``: ``choose`` (the counts its candidates time); ``fix --apply``: ``edit``
  (``torch.set_num_threads(n)`` at the top of the script's main);
- a finding's code: ``SNIPPET``.

torch is imported only inside the functions that set it, so the registry reads this without torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pitstop.recipes.component import PROCESS, DeviceSettings, ProbeRule
from pitstop.recipes.editing import ProcessEditor
from pitstop.recipes.entries import entry

if TYPE_CHECKING:
    from pitstop.patching import Patches

NAME = "threads"
KNOB = "num_threads"  # the ``Knobs`` field: the count (None: as the script runs)
SURFACE = PROCESS
FINDING = "distributed.threads"
ALSO = ("host.oversubscribed", "host.contention")  # the contention findings it fixes too
CANDIDATE = "threads"  # the name of ``pitstop fix``'s candidate kind
PROBE = None  # its probe, the thread probe, is judged by the contention rules (see the docstring)
ARMS = ("as_is", "fit")  # the thread probe's arms
PHASES: tuple[str, ...] = ()  # the whole step: threads run every CPU part of it
# profile forces the count when the script's process starts (``inject``, from ``capture/torchcalls``), not
# at each model's first forward as other process components: a second set_num_threads there would pass
# through the script's recorded ask (a rank's ``script_asked_threads``) and change nothing
AT_START = True
SNIPPET = "torch.set_num_threads({value})  # as many as the cores left free (or OMP_NUM_THREADS={value})"

RULE = ProbeRule(
    NAME,
    title="The script runs more intra-op threads than the cores left free",
    evidence="",
    fix="Run {fit} intra-op thread{s}, as many as the cores left free: torch.set_num_threads({fit}) at the "
    "start of the script, or OMP_NUM_THREADS={fit}{fewer}. `pitstop launch --core-list` pins the script "
    "to cores other work leaves free, with one thread per core.",
)

# its registry entry: name, snippet, finding (and ALSO), knob and probe are the constants above
RECIPE = entry(__name__, title="intra-op threads", apply="pitstop.fix.apply.apply_component")


def _count(setting: Any) -> int | None:
    """The thread count a knob's value names (a bare switch, True, names none)."""
    return None if isinstance(setting, bool) or not setting else int(setting)


def apply(device_type: str, on: Any) -> dict[str, Any]:
    """``on`` intra-op threads for the process (a count; on any device: the host's ops use them). What
    was set: ``{"num_threads": n}``, or {} where ``on`` names no count."""
    n = _count(on)
    if n is None:
        return {}
    import torch

    torch.set_num_threads(n)
    return {KNOB: n}


@contextlib.contextmanager
def scoped(device_type: str, on: Any) -> Iterator[None]:
    """``apply`` for the block, the process's count as it was after it."""
    import torch

    before = torch.get_num_threads()
    applied = apply(device_type, on)
    try:
        yield
    finally:
        if applied:
            torch.set_num_threads(before)


def inject(patches: Patches, n: int) -> None:
    """Profile's injection of the ``num_threads`` knob in this process: ``n`` threads now, and whatever
    count the script asks for later (a script that sets its own would otherwise undo the fix being
    timed); ``patches`` undoes it."""
    import functools

    import torch

    torch.set_num_threads(n)
    orig = torch.set_num_threads

    @functools.wraps(orig)
    def set_num_threads(requested: int) -> None:
        orig(n)

    patches.patch(torch, "set_num_threads", set_num_threads)


def applies(model: Mapping[str, Any], device: DeviceSettings) -> bool:
    """False: the device probes have nothing to change here (the thread probe times it, on the CPU)."""
    return False


def changed(fn: Callable[[], None], device: DeviceSettings) -> Callable[[], None]:
    """``fn`` as it is: no device arm (the thread probe's arms are thread counts, ``ARMS``)."""
    return fn


def cannot_help(device_type: str, torch_facts: Mapping[str, Any]) -> str | None:
    """None: every run has host threads (``choose`` says when the count is the script's already)."""
    return None


def choose(fit: int | None, share: int, now: int, values: tuple[int, ...] | None = None) -> list[int] | str:
    """The counts ``pitstop fix`` times: ``values`` where given, else ``fit`` (the count the profile found
    to fit the free cores) and, where different, ``share`` (the usable cores / local ranks); less the
    count the script already ran (``now``). Or why none."""
    counts = values or tuple(sorted({int(fit), share} if fit else {share}))
    made = [n for n in counts if n != now and n > 0]
    return made or f"threads: the script already runs {now} intra-op threads"


def fix_text(fit: int, workers: int) -> tuple[str, str]:
    """The contention findings' fix: its words and its code, for ``fit`` threads beside ``workers``
    DataLoader workers."""
    fewer = (
        f"; the {workers} DataLoader workers take cores too: fewer of them leave the step more"
        if workers
        else ""
    )
    text = RULE.fix.format(fit=fit, s="s" if fit != 1 else "", fewer=fewer)
    return text, f"torch.set_num_threads({fit})  # or: OMP_NUM_THREADS={fit} python train.py"


def edit(editor: ProcessEditor) -> dict[str, Any]:
    """``torch.set_num_threads(n)`` first in the script's main (or its ``__main__`` block, or after its
    imports), n the count the fix timed, with ``import torch`` where the script has none."""
    n = _count(editor.setting)
    if n is None:
        raise ValueError("threads: the fix recorded no thread count")
    editor.first_lines(f"torch.set_num_threads({n})  # the thread count pitstop fix measured faster")
    editor.need_torch()
    return {NAME: n}
