"""An optimization as one component: the protocol every per-optimization module in ``pitstop.recipes``
follows (``pitstop.recipes.channels_last`` is the first), modelled on torchtitan's model converters.

A component is a plain module: constants and functions, no class to instantiate; a type checker takes
the module itself as a ``Component``. It holds everything pitstop knows about its optimization; the
commands call it and implement none of it:

- ``pitstop.train`` and ``pitstop bench``: ``apply_model`` / ``apply_input`` on a plain model and batch,
  where the settings (``pitstop.recipes.knobs.Knobs``, field ``KNOB``) turn it on (train: ``wanted``);
- ``pitstop profile``'s injection into an unmodified script (``Overrides.<KNOB>``): the same two, on each
  model the hooks find (once ``ready``) and at each top-level forward; ``model_facts`` and
  ``input_facts``: what it records about each model;
- profile's rules: ``PHASES``, the parts of the step its saving lives in;
- profile's exit probe: where ``applies`` holds for the model's facts, ``pitstop.profile.probe.probes`` times
  the model as it ran (arm ``ARMS[0]``) against ``apply_model`` on a copy fed ``apply_input`` (``ARMS[1]``)
  through ``pitstop.measure``, and stores the result under ``PROBE``; ``RULE`` is the finding that
  ``pitstop.profile.analyze.rulekit.probe_finding`` makes of it (helps / no gain / undecided, by its interval);
- ``pitstop fix``: ``cannot_help`` on the models' recorded facts; ``fix --apply``: ``edit`` on a
  ``ScriptEditor`` (``pitstop.fix.apply`` places the lines with ``ast``);
- the code a finding shows: ``SNIPPET``.

The generic parts (timing, verdicts, placing a line in a file) stay with the commands; the component
gives only what is its own. The module sits below train, profile and tune, so it imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ProbeRule:
    """The finding for one recipe whose ``probe`` times the change on the script's model after the run.

    Texts are ``str.format`` templates over ``{base}`` and ``{new}`` (the probe's medians, formatted),
    the probe's own keys and the fields the caller passes. ``pass_title`` None: no pass finding, only
    the undecided one, when the change did not measure faster.
    """

    recipe: str
    title: str
    evidence: str
    fix: str
    pass_title: str | None = None
    pass_evidence: str = ""
    at_model: bool = False  # the finding points at the model's first forward call


class ScriptEditor(Protocol):
    """What a component's ``fix --apply`` edit may do to the script, at the model's first forward call.
    Each method returns the name it wrote the line for; ``pitstop.fix.apply.Unplaced`` when the place
    cannot be found."""

    def reassign_model(self, value: Callable[[str], str]) -> str:
        """``model = value("model")`` after the statement that assigns the model called at the forward."""
        ...

    def reassign_input(self, value: Callable[[str], str]) -> str:
        """``x = value("x")`` for the forward's first argument ``x`` (a plain name): after the statement
        that moves it with ``.to(...)``, else before the forward's statement."""
        ...

    def need_torch(self) -> None:
        """``import torch`` beside the script's imports, where it has none."""
        ...


class Component(Protocol):
    """One optimization, whole (see the module's docstring for which command calls which part)."""

    NAME: str  # its ``pitstop.recipes`` entry's name
    KNOB: str  # the ``pitstop.recipes.knobs.Knobs`` field that turns it on (its entry's ``override``)
    FINDING: str  # the id of the finding its rule makes
    PROBE: str  # the key of its probe's result in ``run_probes``' output
    ARMS: tuple[str, str]  # the probe's arms: as the script ran, with the change
    PHASES: tuple[str, ...]  # the parts of the step (``Breakdown`` fields) its saving lives in
    SNIPPET: str  # the code change a finding shows
    RULE: ProbeRule  # its probe's result -> finding

    def wanted(self, setting: Any, model: Any) -> bool:
        """Whether ``pitstop.train`` applies it to ``model`` for the ``TrainConfig`` setting (``"auto"``:
        the component's own rule)."""
        ...

    def ready(self, model: Any) -> bool:
        """Whether ``apply_model`` can change ``model`` now (else after its first forward)."""
        ...

    def model_facts(self, model: Any) -> dict[str, Any]:
        """What profile records about a model for this optimization (merged into its model facts)."""
        ...

    def input_facts(self, tensors: Sequence[Any]) -> dict[str, Any]:
        """What profile records about a forward's input tensors (merged into its model facts)."""
        ...

    def applies(self, facts: Mapping[str, Any]) -> bool:
        """Whether the probe has something to change in the model whose facts these are."""
        ...

    def cannot_help(self, models: Sequence[Mapping[str, Any]]) -> str | None:
        """Why the change has nothing to act on in a script whose models' facts these are, or None."""
        ...

    def apply_model(self, model: Any) -> Any:
        """The model with the change (in place; returned for chaining)."""
        ...

    def apply_input(self, batch: Any) -> Any:
        """A batch (tensor, tuple, list, dict) as the changed model wants it."""
        ...

    def edit(self, editor: ScriptEditor) -> None:
        """The change written into the script, through ``editor``."""
        ...
