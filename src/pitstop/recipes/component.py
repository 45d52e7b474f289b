"""An optimization as one component: the protocol every per-optimization module in ``pitstop.recipes``
follows (``pitstop.recipes.channels_last`` is the worked example), modelled on torchtitan's model
converters.

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

Each component declares the ``SURFACE`` it acts on, so a generic caller iterates the ones whose parts it
calls (``pitstop.recipes.components(surface)``): ``MODEL`` (``ModelComponent``: the model and its batches,
channels_last), ``FORWARD`` (the forward wrapped, not changed: autocast), ``OPTIMIZER`` (the optimizer's
constructor: optimizer_impl), ``PROCESS`` (``ProcessComponent``: a process-wide setting, tf32,
cudnn_benchmark), ``DTYPE`` (``DtypeComponent``: the model's dtype, its inputs converted in and its
outputs back: float32), ``WRAP`` (``WrapComponent``: the model's call wrapped, torch.compile), ``LOADER``
(``LoaderComponent``: a DataLoader keyword, ``pitstop.recipes.dataloader``). What every one has is
``Component``; the parts of one surface are listed in its module.

The generic parts (timing, verdicts, placing a line in a file) stay with the commands; the component
gives only what is its own. A rule that is more than one ``ProbeRule`` (the optimizer's, one finding per
site) is a function that takes profile's verdicts as a ``Judge``. The module sits below train, profile and
tune, so it imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pitstop.findings import Finding, Severity

if TYPE_CHECKING:
    from pitstop.patching import Patches

MODEL = "model"  # the model's parameters and its batches
FORWARD = "forward"  # the forward pass wrapped (a context), the model as it is
OPTIMIZER = "optimizer"  # the optimizer's constructor
PROCESS = "process"  # a process-wide setting
DTYPE = "dtype"  # the model's dtype: its inputs converted on the way in, its outputs back on the way out
WRAP = "wrap"  # the model's call wrapped (compiled), its parameters and the script's code as they are
LOADER = "loader"  # a keyword of the DataLoader's constructor
SURFACES = (MODEL, FORWARD, OPTIMIZER, PROCESS, DTYPE, WRAP, LOADER)


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


class Judge(Protocol):
    """Profile's verdicts on a probe result, for a component rule that is a function
    (``pitstop.profile.analyze.rulekit`` is one): the thresholds stay with profile's rules."""

    def probe_helps(self, probe: dict[str, Any]) -> bool:
        """Whether the change measured a saving worth counting."""
        ...

    def saving_verdict(self, probe: dict[str, Any], step_s: float) -> str:
        """HELPED, NO_GAIN or UNDECIDED (``pitstop.measure``) for the probe's interval against the bar."""
        ...

    def cost(self, bd: Any, saving: float) -> tuple[float, float]:
        """The saving per step and its share of the step (``bd``: the run's ``Breakdown``)."""
        ...

    def sev(self, share: float | None) -> Severity:
        """The severity of a problem costing ``share`` of the step."""
        ...

    def undecided(
        self, name: str, probe: dict[str, Any], step_s: float, evidence: str, where: str | None
    ) -> Finding:
        """The info finding for a probe that neither helped nor ruled a gain out."""
        ...


class LoaderJudge(Protocol):
    """Profile's thresholds and costs, for a ``LOADER`` component's rule (``rulekit`` is one)."""

    WARN_SHARE: float  # a cost from this share of the step is a warning
    MIN_SHARE: float  # a finding whose point is its cost is left out under this share

    def cost(self, bd: Any, saving: float) -> tuple[float, float]:
        """The saving per step and its share of the step (``bd``: the run's ``Breakdown``)."""
        ...

    def sev(self, share: float | None) -> Severity:
        """The severity of a problem costing ``share`` of the step."""
        ...


class HostJudge(LoaderJudge, Protocol):
    """Profile's thresholds, costs and probe verdict, for the ``HOST`` component's rule (``rulekit`` is
    one)."""

    MIN_FAULTS_TO_TIME: int  # fewer faults saved in the probe: its time difference is mostly noise
    FAULTS_WORTH_A_RUN: int  # untimed page faults per step worth a ``pitstop fix`` run

    def probe_helps(self, probe: dict[str, Any]) -> bool:
        """Whether the change measured a saving worth counting."""
        ...


class DeviceSettings(Protocol):
    """The device's capability, its fp32 matmul precision and cuDNN autotuning, as a ``PROCESS``
    component's probe reads and sets them (``pitstop.profile.probe.gpu_probes.Backend`` is one; tests give
    fakes)."""

    def capability(self) -> tuple[int, int]:
        """The CUDA compute capability."""
        ...

    def get_matmul_precision(self) -> str:
        """``torch.get_float32_matmul_precision()``."""
        ...

    def set_matmul_precision(self, precision: str) -> None:
        """``torch.set_float32_matmul_precision(precision)``."""
        ...

    def get_cudnn_benchmark(self) -> bool:
        """``torch.backends.cudnn.benchmark``."""
        ...

    def set_cudnn_benchmark(self, on: bool) -> None:
        """``torch.backends.cudnn.benchmark = on``."""
        ...


class Component(Protocol):
    """What every component has, whatever its surface (see the module's docstring for which command
    calls which part)."""

    NAME: str  # its ``pitstop.recipes`` entry's name
    KNOB: str  # the ``pitstop.recipes.knobs.Knobs`` field that turns it on (its entry's ``override``)
    SURFACE: str  # what it changes: one of ``SURFACES``
    FINDING: str  # the id of the finding its rule makes
    PROBE: str | None  # the key of its probe's result in ``run_probes``' output (None: no probe, compile)
    ARMS: tuple[str, str]  # the probe's arms: as the script ran, with the change
    PHASES: tuple[str, ...]  # the parts of the step (``Breakdown`` fields) its saving lives in
    SNIPPET: str  # the code change a finding shows
    RULE: ProbeRule  # its probe's result -> finding (texts; ``rules``, ``findings`` may apply it)

    def edit(self, editor: Any) -> dict[str, Any]:
        """The change written into the script through ``editor`` (a ``ScriptEditor`` for ``MODEL``,
        ``FORWARD``, ``DTYPE`` and ``WRAP``, an ``OptimizerEditor`` for ``OPTIMIZER``, a ``ProcessEditor`` for ``PROCESS``,
        a ``LoaderEditor`` for ``LOADER``); what it changed, as the patch records it."""
        ...


class ProbedComponent(Component, Protocol):
    """A component whose probe times the model's forward+backward (``MODEL``, ``FORWARD``): profile's
    rules judge its ``RULE`` by ``rulekit.probe_finding``."""

    def rule_fields(
        self, model: Mapping[str, Any], probe: Mapping[str, Any], device: str
    ) -> dict[str, Any] | None:
        """The fields ``RULE``'s texts take beside the probe result's, from the model's facts; None where
        the probe result has nothing to judge."""
        ...


class ForwardComponent(ProbedComponent, Protocol):
    """A ``FORWARD`` component: the forward run under a context (autocast)."""

    def context(self, device_type: str, setting: Any) -> AbstractContextManager[Any]:
        """The context the forward runs under for the knob's value (a no-op for None)."""
        ...

    def as_ran(self, device_type: str, facts: Mapping[str, Any]) -> AbstractContextManager[Any]:
        """The context the script's own forward ran under (every probe runs the model so)."""
        ...

    def choose(self, device_type: str, requested: bool) -> str:
        """The knob's value ``pitstop fix`` tries here, or why none (a sentence)."""
        ...

    def cannot_help(self, models: Sequence[Mapping[str, Any]]) -> str | None:
        """Why the change has nothing to act on in a script whose models' facts these are, or None."""
        ...

    def unprobed(self, model: Mapping[str, Any], device: str) -> list[Finding]:
        """What profile says where the probe did not run."""
        ...


class OptimizerComponent(Component, Protocol):
    """An ``OPTIMIZER`` component: a keyword of the optimizer's constructor (optimizer_impl)."""

    def kwargs(self, on: bool) -> dict[str, Any]:
        """The constructor keywords ``pitstop.train.make_optimizer`` passes."""
        ...

    def inject(self, defaults: Any, setting: Any) -> tuple[Any, Any]:
        """An optimizer's constructor defaults with the knob's value applied, and what was applied."""
        ...

    def changed(self, opt: Any) -> Any:
        """The probe's changed arm: a copy of the optimizer with the change."""
        ...

    def choose(self, device_type: str) -> str:
        """The knob's value ``pitstop fix`` tries here."""
        ...

    def cannot_help(self, optimizers: Sequence[Mapping[str, Any]]) -> str | None:
        """Why the change has nothing to act on for these recorded optimizers, or None."""
        ...

    def rules(
        self, bd: Any, optimizers: list[dict[str, Any]], probes: dict[str, Any], judge: Judge
    ) -> list[Finding]:
        """Profile's findings for the recorded optimizers and their probe results."""
        ...


class ModelComponent(ProbedComponent, Protocol):
    """A ``MODEL`` component: the model and its batches changed."""

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

    def train_model(self, model: Any) -> Any:
        """What ``pitstop.train`` adds after ``apply_model``, where it owns the training loop (hooks on the
        backward, say); profile's injection and fix never call it. Returns the handles (``remove()``) of
        the hooks it added to the user's modules, which ``fit`` removes when it returns or raises."""
        ...


class ProcessComponent(Component, Protocol):
    """A ``PROCESS`` component: a process-wide setting (tf32, cudnn_benchmark); its ``RULE`` is judged by
    ``rulekit.probe_finding`` with no fields of its own."""

    CANDIDATE: str  # the name of ``pitstop fix``'s candidate that turns it on

    def apply(self, device_type: str, on: Any) -> dict[str, Any]:
        """The setting at the knob's value ``on`` (a switch's bool, threads' count) for the process where
        it acts on ``device_type``; what was set ({}: nothing here)."""
        ...

    def scoped(self, device_type: str, on: Any) -> AbstractContextManager[None]:
        """``apply`` for a block, the previous settings restored after it."""
        ...

    def applies(self, model: Mapping[str, Any], device: DeviceSettings) -> bool:
        """Whether the probe has something to change for the model whose facts these are, on ``device``."""
        ...

    def changed(self, fn: Callable[[], None], device: DeviceSettings) -> Callable[[], None]:
        """The probe's changed arm: ``fn`` run with the setting on, restored after."""
        ...

    def cannot_help(self, device_type: str, torch_facts: Mapping[str, Any]) -> str | None:
        """Why the setting has nothing to change in a run on ``device_type`` with these torch settings."""
        ...


class DtypeComponent(Component, Protocol):
    """A ``DTYPE`` component: the model's dtype changed at its boundary (float32), so the script's code
    around the forward sees the dtypes it made; not applied to a model called as ``model.forward(x)``,
    whose inputs cannot be converted. Its ``RULE`` is judged by ``rulekit.probe_finding``; its probe's
    record names the changed dtype (``ARMS[1]``)."""

    def applies(self, facts: Mapping[str, Any]) -> bool:
        """Whether the model whose facts these are has something to change (probe, rule)."""
        ...

    def apply_model(self, model: Any) -> Any:
        """The model with the change (in place; returned for chaining)."""
        ...

    def apply_input(self, batch: Any) -> Any:
        """A batch (tensor, tuple, list, dict) as the changed model wants it."""
        ...

    def apply_output(self, out: Any) -> Any:
        """The changed model's output as the script's code after the forward expects it."""
        ...

    def unprobed(self, model: Mapping[str, Any], probes: Mapping[str, Any]) -> Finding:
        """What profile says where the model has something to change but the probe did not run."""
        ...


class WrapComponent(Component, Protocol):
    """A ``WRAP`` component: the model's call wrapped (torch.compile), the model and the script's code as
    they are. No in-process probe (``PROBE`` None): its ``findings`` say where it is not used, ``pitstop
    fix`` times it on the whole script (its candidate named ``CANDIDATE``)."""

    CANDIDATE: str  # the name of ``pitstop fix``'s candidate that turns it on

    def wrap(self, model: Any, **kwargs: Any) -> Any:
        """The model wrapped (train, bench), falling back to the plain model where the wrapper fails."""
        ...

    def failed(self, model: Any) -> BaseException | None:
        """The error ``wrap``'s model fell back on, if any."""
        ...

    def inner(self, model: Any) -> Any:
        """The model inside the wrapper, or None where ``model`` is none."""
        ...

    def install(self, patches: Patches) -> None:
        """Profile's injection, once before the script runs; what it sets is undone with ``patches``."""
        ...

    def inject(self, module: Any) -> str | None:
        """Profile's injection on a model found (in place); why it could not, or None."""
        ...

    def model_facts(self, module: Any) -> dict[str, Any]:
        """What profile records about a model for this optimization (merged into its model facts)."""
        ...

    def findings(self, model: Mapping[str, Any], torch_facts: Mapping[str, Any]) -> list[Finding]:
        """Profile's findings for the model's facts and the run's torch facts."""
        ...


class LoaderComponent(Component, Protocol):
    """A ``LOADER`` component: one keyword of the DataLoader's constructor (``pitstop.recipes.dataloader``).
    No in-process probe (``PROBE`` None): its ``rules`` judge the run's data wait."""

    KEY: str  # the DataLoader keyword; its knob is ``dataloader.<KEY>``
    NEEDS_WORKERS: bool  # DataLoader rejects the keyword without worker processes
    DEFAULT: Any  # torch's value where the call leaves the keyword out

    def value(self, given: Any) -> Any:
        """The keyword's value as given to a DataLoader, as a plain value (None: ``DEFAULT``)."""
        ...

    def apply_loader_kwargs(
        self, kwargs: Mapping[str, Any], knobs: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
        """The constructor's keywords with the value ``knobs`` (``Knobs.dataloader``) forces, what was
        applied, and what was skipped and why."""
        ...

    def facts(self, loader: Any) -> dict[str, Any]:
        """What profile records of a built DataLoader for this keyword."""
        ...

    def candidates(self, loader: Mapping[str, Any], machine: Any, values: Any) -> list[Any] | str:
        """``pitstop fix``'s (name, forced keywords) for the recorded loader (``machine``: a
        ``recipes.workers.WorkerMachine``; ``values``: the counts asked for), or why none."""
        ...

    def rules(self, run: Any, judge: LoaderJudge) -> list[Finding]:
        """Profile's findings for the run's loaders (``run``: a ``recipes.dataloader.LoaderRun``)."""
        ...


def scoped_arm(
    fn: Callable[[], None], get: Callable[[], Any], put: Callable[[Any], None], value: Any
) -> Callable[[], None]:
    """A process component's changed probe arm: ``fn`` run with the setting at ``value`` (``put``), the
    previous one (``get``) restored after, so the arms interleave in one process."""

    def run_it() -> None:
        prev = get()
        put(value)
        try:
            fn()
        finally:
            put(prev)

    return run_it


# The training loop's own optimizations: applied by ``pitstop.train`` and bench, injected by profile
# where a knob names them, never probed in the script's process (no ``ARMS``, no ``RULE``). Their rules
# are functions of what profile hands them, each with its own inputs (``host_memory.rules``: the probe's
# result and a ``HostJudge``; ``step.no_sync_rule``, ``step.static_graph_rule``: the ranks' summaries and
# the warning share), so ``LoopComponent`` names none and ``components()`` without a surface leaves them out.
STEP = "step"  # the step loop's structure: micro-batches per optimizer step, DDP's gradient sync among them
HOST = "host"  # the host process's allocator (glibc malloc's thresholds)
BLOCKS = "blocks"  # chosen submodules' forwards, dropped in the forward and recomputed in the backward
LOOP_SURFACES = (STEP, HOST, BLOCKS)


class LoopComponent(Protocol):
    """A ``STEP``, ``HOST`` or ``BLOCKS`` component; the parts of its surface are listed in its module."""

    NAME: str  # its ``pitstop.recipes`` entry's name
    KNOB: str | None  # its ``Knobs`` / ``Overrides`` field (None: a ``TrainConfig`` / bench setting only)
    SURFACE: str  # one of ``LOOP_SURFACES``
    FINDING: str | None  # the id of the finding profile's rules make for it (None: none)
    SNIPPET: str  # the code change a finding shows
