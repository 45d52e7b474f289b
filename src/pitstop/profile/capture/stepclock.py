"""The step clock: where steps begin and end, and how a step's time splits into exclusive phases.

Phases nest (forward and backward inside an optimizer closure, a sync inside forward, a copy inside a
forward): each moment counts in the innermost open phase only, so the parts of a step add up to it and
"other" is what no phase covered.

Steps are delimited one of two ways:

- ``optimizer``: by optimizer steps (global optimizer step hooks). A step ends where the next one may
  begin (the next batch, the next top-level forward, the next ``step()`` of an optimizer that already
  stepped) once the *closing* optimizer has stepped in it. With one optimizer that is it: gradient
  accumulation and LBFGS closures give one step per optimizer step. With several (a GAN's D and G,
  a WGAN critic stepped ``n_critic`` times per generator step) a step is one cycle of them: the closing
  optimizer is the one that steps least often (every ``gap`` optimizer steps), of equals the one that
  first stepped last, so D then G is one step, and five critic steps then one generator step are one.
  Only optimizers that step regularly count: one whose gap is unknown (it stepped once), longer than
  ``MAX_CYCLE`` optimizer steps, or that has missed two of its turns does not hold steps open. In the
  first steps a change of the closing optimizer drops the records and restarts the warm-up (at most
  ``MAX_RECUTS`` times), so measured steps are whole cycles.
- ``backward``: by top-level backward calls, for loops without ``torch.optim`` (manual SGD, custom
  updates). Chosen when ``BACKWARDS_BEFORE_FALLBACK`` backward calls ran and no optimizer stepped; the
  iterations before the choice are not recorded. An optimizer step seen later switches to ``optimizer``
  (gradient accumulation over more micro-batches than that) and drops the micro-steps recorded so far.
"""

from __future__ import annotations

from typing import Any

PHASES = ("data_wait_s", "h2d_s", "forward_s", "backward_s", "optimizer_s", "sync_s")
DATA, H2D, FORWARD, BACKWARD, OPTIMIZER, SYNC = PHASES
# an optimizer closure's own Python (a framework's training-step plumbing): not the optimizer's time,
# and not a part of its own: it is left to "other"
CLOSURE = "closure"
_ALL = (*PHASES, CLOSURE)
_ZEROS = dict.fromkeys(_ALL, 0.0)  # a step's phase seconds before it begins (copied: a dict copy is cheap)
BACKWARDS_BEFORE_FALLBACK = 3
MAX_CYCLE = 16  # optimizer steps: an optimizer stepped more rarely than this does not delimit steps
MAX_RECUTS = 3  # the warm-up restarts at most this often for a new closing optimizer (irregular loops)
PENDING, BY_OPTIMIZER, BY_BACKWARD = "pending", "optimizer", "backward"
BOUNDARY_LABELS = {BY_OPTIMIZER: "optimizer.step()", BY_BACKWARD: "backward()"}


class PhaseClock:
    """Exclusive seconds per phase since the last ``reset``. The stack of open phases survives a reset:
    a phase open across a step boundary goes on counting in the next step."""

    __slots__ = ("acc", "done", "mark", "spans", "stack")

    def __init__(self) -> None:
        self.acc = dict.fromkeys(_ALL, 0.0)
        self.done = dict.fromkeys(_ALL, 0.0)  # seconds in phases before the last split, whole run
        self.stack: list[str] = []
        self.mark = 0.0
        # (phase, start, end) of each stretch counted, while ``--trace``'s window records them (else None)
        self.spans: list[tuple[str, float, float]] | None = None

    def _count(self, phase: str, start: float, end: float) -> None:
        self.acc[phase] += end - start
        if self.spans is not None and end > start:
            self.spans.append((phase, start, end))

    def enter(self, phase: str, now: float) -> None:
        stack = self.stack
        if stack:
            self.acc[stack[-1]] += now - self.mark  # inline, not _count: this runs on every event
            if self.spans is not None:
                self.spans.append((stack[-1], self.mark, now))
        stack.append(phase)
        self.mark = now

    def exit(self, phase: str, now: float) -> None:
        stack = self.stack
        if phase not in stack:
            return
        self.acc[stack[-1]] += now - self.mark
        if self.spans is not None:
            self.spans.append((stack[-1], self.mark, now))
        while stack.pop() != phase:  # inner phases an exception left open end here too
            pass
        self.mark = now

    def cancel(self, phase: str) -> None:
        """Leave ``phase`` as if it never opened: its time goes to the phase around it."""
        if self.stack and self.stack[-1] == phase:
            self.stack.pop()

    def move(self, phase: str, dt: float, now: float) -> None:
        """The ``dt`` seconds just before ``now`` belong to ``phase`` (a per-element sync loop's gaps)."""
        stack = self.stack
        if stack:
            self._count(stack[-1], self.mark, max(self.mark, now - dt))
        self._count(phase, now - dt, now)
        self.mark = now

    def inside(self, phase: str) -> bool:
        return phase in self.stack

    def split(self, now: float) -> dict[str, float]:
        """The phases' seconds up to ``now``, then zero them (the open phases continue)."""
        if self.stack:
            self._count(self.stack[-1], self.mark, now)
        self.mark = now
        out = self.acc
        self.acc = _ZEROS.copy()
        done = self.done
        for k in _ALL:
            done[k] += out[k]
        return out

    def run_totals(self) -> dict[str, float]:
        """Seconds per phase over the whole run so far."""
        return {k: v + self.acc[k] for k, v in self.done.items()}


class StepClock:
    """Step boundaries and phases. ``Instrumentation`` calls it at each point and builds the records."""

    def __init__(self) -> None:
        self.phases = PhaseClock()
        self.mode = PENDING
        self.step_start: float | None = None  # None: the next boundary begins a step
        self.stepped: set[int] = set()  # optimizers that stepped in this step
        self.backwards = 0  # top-level backward calls finished in this step
        self.backwards_total = 0
        self.last_end: float | None = None  # end of this step's last optimizer step / backward
        self.dropped = False  # a mode switch dropped the records made so far
        self.cycle = OptimizerCycle()
        self.recuts = 0  # warm-ups restarted because the closing optimizer changed

    # the decisions ``Instrumentation`` acts on
    def should_close(self) -> bool:
        """At a point where a step may begin: does the current one end here?"""
        closer = self.cycle.closer
        if closer is None:
            return bool(self.stepped) or (self.mode == BY_BACKWARD and self.backwards > 0)
        return closer in self.stepped

    def repeats(self, opt: Any) -> bool:
        """Before ``opt.step()``: does the current step end here (``opt`` already stepped in it, and the
        step holds the whole cycle)?"""
        return id(opt) in self.stepped and self.should_close()

    def optimizer_started(self) -> None:
        if self.mode == PENDING:  # an LBFGS closure's backward calls must not look like a loop without one
            self.mode = BY_OPTIMIZER

    def optimizer_stepped(self, opt: Any, now: float, warm_done: bool = False, recorded: int = 0) -> bool:
        """After ``opt.step()``. True when the records so far (``recorded`` of them) were micro-steps, or,
        in the warm-up or the first ``MAX_CYCLE`` records, cut at another optimizer than the cycle's
        closing one, and must be dropped."""
        self.stepped.add(id(opt))
        multi = self.cycle.stepped(id(opt))
        self.last_end = now
        if self.mode == BY_OPTIMIZER:
            early = multi and (not warm_done or recorded < MAX_CYCLE)
            if early and self.recuts < MAX_RECUTS and self.cycle.miscut():
                self.recuts += 1
                self.cycle.reset_cuts()
                self.step_start = None  # the cycle's first step begins at the next boundary
                return True
            return False
        drop = self.mode == BY_BACKWARD
        self.mode = BY_OPTIMIZER
        if drop:
            self.step_start = None  # the step in progress began mid-period: start at the next boundary
        return drop

    def backward_done(self, now: float) -> None:
        self.backwards += 1
        self.backwards_total += 1
        self.last_end = now
        if self.mode == PENDING and self.backwards_total >= BACKWARDS_BEFORE_FALLBACK:
            self.mode = BY_BACKWARD
            self.step_start = None  # the iterations so far ran as one: count from the next boundary

    def begin(self, now: float, split: bool = True) -> None:
        """A step begins at ``now``; ``split`` False: ``times(now)`` just split the phases there."""
        self.step_start = now
        self.stepped.clear()
        self.backwards = 0
        self.last_end = None
        if split:
            self.phases.split(now)

    def times(self, now: float) -> dict[str, float]:
        """The closing step's exclusive phase seconds (``PHASES``) and "total_s"."""
        assert self.step_start is not None
        if len(self.cycle.seen) > 1:
            self.cycle.cut(self.stepped)
        acc = self.phases.split(now)
        del acc[CLOSURE]
        acc["total_s"] = now - self.step_start
        return acc

    def pending_end(self) -> float | None:
        """Where a step left open at the end of the script ends, if it holds a step's work: after its last
        optimizer step or backward, or after the no-grad work booked to it since (an eval pass)."""
        if self.step_start is None or not self.should_close() or self.last_end is None:
            return None
        return max(self.last_end, self.phases.mark)

    def boundary_label(self) -> str | None:
        return BOUNDARY_LABELS.get(self.mode)


class OptimizerCycle:
    """Which optimizer closes a step when several step (``StepClock``'s docstring). Updated at each
    optimizer step; with a single optimizer it costs a dict lookup and leaves ``closer`` None."""

    __slots__ = ("closer", "cuts", "held", "n", "seen")

    def __init__(self) -> None:
        self.n = 0  # optimizer steps so far, all optimizers
        self.seen: dict[int, list[int]] = {}  # id -> [first step index, last step index, gap or 0]
        self.closer: int | None = None  # None: any optimizer's step closes the step
        self.cuts = 0  # steps closed with several optimizers known, since the last ``reset_cuts``
        self.held: dict[int, int] = {}  # id -> how many of those steps it stepped in

    def stepped(self, key: int) -> bool:
        """``key``'s optimizer stepped; True when several optimizers step (``closer`` is then updated)."""
        n = self.n
        self.n = n + 1
        rec = self.seen.get(key)
        if rec is None:
            self.seen[key] = [n, n, 0]
        else:
            rec[2] = n - rec[1]
            rec[1] = n
        if len(self.seen) < 2:
            return False
        self.closer = self._closer(n)
        return True

    def _closer(self, n: int) -> int | None:
        best, rank = None, (0, -1)
        for key, (first, last, gap) in self.seen.items():
            if 0 < gap <= MAX_CYCLE and n - last <= 2 * gap and (gap, first) > rank:
                best, rank = key, (gap, first)
        return best

    def cut(self, stepped: set[int]) -> None:
        """A step closed holding the steps of ``stepped``."""
        self.cuts += 1
        held = self.held
        for key in stepped:
            held[key] = held.get(key, 0) + 1

    def miscut(self) -> bool:
        """Whether a step closed since the last reset lacked the closing optimizer's step, the closing
        optimizer being settled: every optimizer stepping lately has stepped twice (its gap is known)."""
        closer, n = self.closer, self.n
        if closer is None or self.held.get(closer, 0) >= self.cuts:
            return False
        return all(gap or n - last > MAX_CYCLE for _, last, gap in self.seen.values())

    def reset_cuts(self) -> None:
        self.cuts = 0
        self.held.clear()
