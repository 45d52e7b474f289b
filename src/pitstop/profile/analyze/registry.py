"""The rule interface: a rule is a function from one run's ``RunView`` to its findings, registered by the
``@rule(order=...)`` decorator on its definition, so ``rules.problem_findings`` runs every registered rule
in their declared order without naming one. A new rule is a decorated function in a module the rules
import (``rules.RULE_MODULES``); its ``order`` places it among the others (``registered()`` lists them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pitstop.findings import Finding
from pitstop.profile.record.measurements import Measurements, ModelRecord
from pitstop.profile.record.timeline import Breakdown, StepRecord

# when a rule runs: only where steps were measured (it reads the breakdown), only where none was, or both
When = Literal["steps", "no_steps", "always"]


@dataclass(frozen=True)
class RunView:
    """What a rule reads of one run: its measured steps and their ``breakdown`` (None where no step was
    measured), its typed ``Measurements``, the usable cores and the device's kind."""

    steps: list[StepRecord]
    bd: Breakdown | None
    m: Measurements
    cores: int

    @property
    def dev_type(self) -> str:
        return self.m.dev_type

    @property
    def model(self) -> ModelRecord:
        return self.m.model

    @property
    def probes(self) -> dict[str, Any]:
        return self.m.probe_results

    @property
    def breakdown(self) -> Breakdown:
        """The breakdown, for rules that run only where steps were measured (``When`` "steps")."""
        assert self.bd is not None, "a rule registered for measured steps ran without any"
        return self.bd


RuleFn = Callable[[RunView], list[Finding]]


@dataclass(frozen=True)
class Rule:
    name: str
    order: int
    when: When
    fn: RuleFn

    def applies(self, view: RunView) -> bool:
        return self.when == "always" or (self.when == "steps") == (view.bd is not None)


_RULES: dict[str, Rule] = {}


def rule(order: int, when: When = "steps", name: str | None = None) -> Callable[[RuleFn], RuleFn]:
    """Register the decorated function as a rule run at ``order`` (lower first); ``name``: its key
    (default: module and function), so registering the same rule again replaces it."""

    def register(fn: RuleFn) -> RuleFn:
        key = name or f"{fn.__module__}.{fn.__qualname__}"
        _RULES[key] = Rule(key, order, when, fn)
        return fn

    return register


def unregister(name: str) -> None:
    _RULES.pop(name, None)


def registered() -> list[Rule]:
    """Every registered rule, in its declared order (ties: by name)."""
    return sorted(_RULES.values(), key=lambda r: (r.order, r.name))


def run_rules(view: RunView) -> list[Finding]:
    """The findings of every registered rule that applies to ``view``, in order."""
    return [f for r in registered() if r.applies(view) for f in r.fn(view)]
