"""``torch.compile`` as one component (``pitstop.recipes.component``) whose ``SURFACE`` is the model's
call, wrapped: the model's parameters and the script's code as they are. All that pitstop knows and does
about it.

``torch.compile`` traces the model into graphs (dynamo) and generates fused kernels for them (inductor): it
costs its compilation up front, at the first call (seconds to minutes), and saves a share of every later
step. A failure to compile falls back to eager, and says so. Which command calls which part:

- ``pitstop.train`` (``TrainConfig.compile``; ``pitstop.train.compile.maybe_compile`` serves ``wrap``
  under the name scripts use) and ``pitstop bench``'s compile rows (a row whose ``Knobs.compile`` is on):
  ``wrap``, then ``failed`` (a bench row that fell back to eager measures nothing); ``pitstop.train``'s
  ``compile='auto'`` (``pitstop.train.compile_auto``): after timing the first eager steps, ``pays`` (CUDA)
  or ``worth_a_trial`` then a measured trial (``TRIAL_DEVICES``, the CPU);
  ``pitstop.train.unwrap``: ``inner``;
- ``pitstop profile --override compile`` (``Knobs.compile``, ``pitstop fix``'s runs;
  ``pitstop.profile.capture.models``): ``install`` once, ``inject`` on each model found;
- profile's facts (``pitstop.profile.capture.facts``): ``model_facts``; profile's rules
  (``rules_compute.setup_rules``): ``findings``, the info finding ``RULE`` words (no probe: compiling
  takes too long to time in the script's process, so ``PROBE`` is None and ``pitstop fix`` times it on
  the whole script);
- ``pitstop fix``: its candidate, named ``CANDIDATE``; ``fix --apply``: ``edit`` (a ``ScriptEditor``);
- a finding's code: ``SNIPPET``.

torch is imported only inside the functions that use it (the wrapper module,
``pitstop.recipes.compile_fallback``, imports it), so the registry reads this without torch.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pitstop.findings import Finding, Severity
from pitstop.recipes.component import WRAP, ProbeRule
from pitstop.recipes.editing import ScriptEditor
from pitstop.recipes.entries import entry

if TYPE_CHECKING:
    import torch

    from pitstop.patching import Patches

NAME = "compile"
KNOB = "compile"  # the ``Knobs`` field that turns it on (bench, profile's injection; ``TrainConfig.compile``)
SURFACE = WRAP
FINDING = "compile.none"
CANDIDATE = "torch.compile"  # the name of ``pitstop fix``'s candidate
PROBE = None  # no in-process probe: compiling takes minutes; ``pitstop fix`` times it on the whole script
ARMS = ("eager", "compiled")
PHASES = ("forward_s", "backward_s")  # the parts of the step its saving lives in
SNIPPET = "model.compile()"
# the statement fix --apply writes after the model's line: ``Module.compile()`` compiles in place, as the
# timed run did (``inject``); ``torch.compile(model)``'s wrapper would prefix the state_dict keys with
# ``_orig_mod.``, so the script's checkpoints would stop loading into an uncompiled model
CONVERT = "{}.compile()"

# compile='auto': the share of an eager step compile saves (``pays``), and the seconds of compilation
# expected, per device. CPU, measured on a 2-core AMD EPYC with AVX512_BF16
# (``benchmarks/results/compile_auto.md``): ``torch.compile`` of fit's fast path saved 3% (bf16) and
# 16-19% (fp32, bf16 emulated away) a step on the benchmark conv net, and lost 3% (bf16) and 21% (fp32) on
# a small transformer: the sign depends on the model, so no saving is stated and a CPU run is decided by
# a trial in the run instead (``TRIAL_DEVICES``; ``pays`` with this 0% would never compile). Compilation
# took 21-42 s cold (empty inductor cache, load ~5), 1.6-5.4 s warm, over 90 s cold at load ~8: 60 s is
# expected. CUDA: 1.3-2x in ``pitstop bench``'s compile rows (``docs/bench.md``), so 20%, with the same
# 60 s (not remeasured); ``pays`` decides there.
SAVING = {"cpu": 0.0, "cuda": 0.20}
COMPILE_S = {"cpu": 60.0, "cuda": 60.0}
# Where compile='auto' measures instead (``pitstop.train.compile_auto``): compile, time the compilation,
# then interleave eager and compiled steps. Only where the host clock between two steps times the step:
# a CPU's work is synchronous; a CUDA step is queued and the loop never syncs, so there it would time
# the queue, and the stated ``pays`` decides.
TRIAL_DEVICES = ("cpu",)
# A trial starts only where steps left x eager step x TRIAL_MIN_SAVING > COMPILE_S: a trial that finds no
# gain has spent its compilation for nothing, and this bounds that loss to 5% of the run's eager time;
# 5% is also the smallest gain the trial's verdict calls helped outright (its ``min_gain``).
TRIAL_MIN_SAVING = 0.05

RULE = ProbeRule(
    NAME,
    title="The model is not compiled",
    evidence="torch.compile was not used; its gain depends on the model and is not measured by a profile run "
    "(compiling takes minutes). `pitstop fix` measures it.",
    fix="Try torch.compile; keep it if `pitstop fix` shows a gain.",
)

# its registry entry: name, snippet, finding, knob and probe are the constants above
RECIPE = entry(
    __name__,
    title=CANDIDATE,
    train="TrainConfig.compile",
    bench=((NAME, "torch.compile"),),
    apply="pitstop.fix.apply.apply_component",
    untimed=True,
    site="model",
)


def wrap(model: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """``torch.compile(model)`` behind a fallback to eager (``compile_fallback.CompiledWithFallback``), or
    ``model`` itself, with a warning, where this torch cannot compile it (no ``torch.compile``, an unknown
    backend)."""
    import warnings

    import torch

    if not hasattr(torch, "compile"):
        warnings.warn(
            "torch.compile is not available in this torch; training eagerly", RuntimeWarning, stacklevel=2
        )
        return model
    from pitstop.recipes.compile_fallback import CompiledWithFallback

    try:
        return CompiledWithFallback(model, **compile_kwargs)
    except Exception as exc:  # e.g. an unknown backend name fails eagerly
        warnings.warn(f"torch.compile unavailable ({exc}); training eagerly", RuntimeWarning, stacklevel=2)
        return model


def failed(model: Any) -> BaseException | None:
    """The error ``wrap``'s model fell back to eager on, if any (None for a model ``wrap`` left as it was)."""
    return getattr(model, "failed", None)


def inner(model: Any) -> Any:
    """The model inside compile's wrapper (``wrap``'s, or ``torch.compile``'s ``OptimizedModule``), or None
    where ``model`` is no such wrapper."""
    import torch

    from pitstop.recipes.compile_fallback import CompiledWithFallback

    if isinstance(model, CompiledWithFallback):
        return model.module
    orig = getattr(model, "_orig_mod", None)  # torch.compile's wrapper
    return orig if isinstance(orig, torch.nn.Module) else None


def _weigh(
    steps_left: int, step_s: float, share: float, device: str, share_word: str, cost_word: str
) -> tuple[bool, str]:
    """steps left x eager step x ``share`` against ``COMPILE_S[device]``: whether it is more, and the sum
    in words."""
    cost = COMPILE_S.get(device, COMPILE_S["cpu"])
    gain = steps_left * step_s * share
    text = (
        f"{steps_left:,} steps left x {1000 * step_s:.1f} ms x {share:.0%}{share_word} = {gain:.1f} s "
        f"{'>' if gain > cost else '<='} {cost:.0f} s {cost_word}"
    )
    return gain > cost, text


def pays(steps_left: int, step_s: float, device: str) -> tuple[bool, str]:
    """Whether compiling now pays for itself over ``steps_left`` steps of ``step_s`` seconds (eager) on
    ``device``: steps left x step x ``SAVING`` > ``COMPILE_S``; and why, in words."""
    ok, text = _weigh(steps_left, step_s, SAVING.get(device, SAVING["cpu"]), device, " saving", "compilation")
    return ok, ("on: " if ok else "off: ") + text


def worth_a_trial(steps_left: int, step_s: float, device: str) -> tuple[bool, str]:
    """Whether the steps left could pay for a compile trial on ``device``: steps left x eager step x
    ``TRIAL_MIN_SAVING`` > ``COMPILE_S`` (the compilation a trial spends); and why, in words."""
    ok, text = _weigh(steps_left, step_s, TRIAL_MIN_SAVING, device, "", "expected compilation")
    return ok, ("trial: " if ok else "off: no trial: ") + text


def break_even_steps(step_s: float, device: str) -> int:
    """Steps left at which ``pays`` starts compiling, for an eager step of ``step_s`` seconds
    (``sys.maxsize``, never, where the stated saving is none)."""
    saving = SAVING.get(device, SAVING["cpu"])
    if saving <= 0:
        return sys.maxsize
    return int(COMPILE_S.get(device, COMPILE_S["cpu"]) / (step_s * saving)) + 1


def install(patches: Patches) -> None:
    """Profile's injection, once before the script runs: dynamo's errors fall back to eager (the script's
    own ``torch.compile`` calls too) until ``patches`` are undone (the instrumentation's uninstall)."""
    import torch._dynamo as dynamo

    patches.set_value(dynamo.config, "suppress_errors", True)


def inject(module: torch.nn.Module) -> str | None:
    """Profile's injection on a model found: ``module.compile()`` in place (its object and hooks stay);
    why it stays eager (the setup's error), or None."""
    try:
        module.compile()
    except Exception as e:  # compile setup failed: stay eager, say so
        return f"{type(e).__name__}: {e}"
    return None


def model_facts(module: torch.nn.Module) -> dict[str, Any]:
    """What profile records about a model: ``compiled``, by ``torch.compile(model)`` (the
    ``OptimizedModule`` was called) or ``model.compile()`` (in place)."""
    orig = getattr(module, "_orig_mod", module)
    return {"compiled": orig is not module or getattr(module, "_compiled_call_impl", None) is not None}


def findings(model: Mapping[str, Any], torch_facts: Mapping[str, Any]) -> list[Finding]:
    """Profile's finding for a model that ran uncompiled, with no dynamo graph in the process: info, as
    ``RULE`` words it (``pitstop fix`` times it); none where nothing was recorded or it was compiled."""
    if not model or model.get("compiled") or torch_facts.get("dynamo_graphs"):
        return []
    return [
        Finding(
            id=FINDING,
            severity=Severity.INFO,
            title=RULE.title,
            evidence=RULE.evidence,
            fix=RULE.fix,
            fix_code=SNIPPET,
            location=model.get("first_location"),
        )
    ]


def edit(editor: ScriptEditor) -> dict[str, Any]:
    """``model.compile()`` after the line that assigns the model called at the forward (no import
    needed)."""
    editor.model_statement(CONVERT.format)
    return {KNOB: True}
