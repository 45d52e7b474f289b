"""compile='auto': the stated rule, the probe that feeds it, and fit switching to the compiled model."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from rich.console import Console

from pitstop.train import TrainConfig, fit, trainer, unwrap
from pitstop.train import compile_auto as ca
from pitstop.train.compile import CompiledWithFallback
from pitstop.train.progress import TrainProgress


class FakeClock:
    """A clock that advances ``step_s`` per read: every timed step takes exactly that long."""

    def __init__(self, step_s: float) -> None:
        self.t, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.t += self.step_s
        return self.t


@pytest.fixture
def cpu_saving(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU with a stated saving (5%): the stated one is none (``benchmarks/results/compile_auto.md``),
    which would keep every CPU run eager; the rule's workings are tested on this one."""
    monkeypatch.setitem(ca.SAVING, "cpu", 0.05)


def test_the_stated_rule_never_compiles_on_a_cpu() -> None:
    """compile measured no saving a step on the CPU that holds for every model: the stated rule never
    compiles there, however long the run (a CPU run is decided by its trial instead)."""
    assert ca.SAVING["cpu"] == 0.0 and ca.break_even_steps(0.022, "cpu") > 10**15
    on, why = ca.rule(10**9, 0.022, "cpu")
    assert not on and why.startswith("off: ") and "0% saving" in why
    assert ca.rule(10**9, 0.022, "cuda")[0]


@pytest.mark.usefixtures("cpu_saving")
def test_rule_compiles_only_where_the_steps_left_pay_for_compilation() -> None:
    step_s = 0.022
    even = ca.break_even_steps(step_s, "cpu")
    on, why = ca.rule(even, step_s, "cpu")
    assert on and why.startswith("on: ")
    off, why = ca.rule(even - 2, step_s, "cpu")
    assert not off and why.startswith("off: ") and "60 s compilation" in why
    assert ca.break_even_steps(step_s, "cuda") < even  # a larger stated saving pays sooner


def test_probe_times_steps_after_warmup_then_decides_once() -> None:
    """On CUDA the stated rule decides right after the probe (no trial)."""
    auto = ca.AutoCompile(planned=10**7, device="cuda", warmup=2, probe=3, clock=FakeClock(0.05))
    got = [auto.decide(step) for step in range(1, 6)]
    assert got[:-1] == [None] * 4 and got[-1] is True  # 2 warm-up steps, then 3 timed ones
    assert auto.decision is not None and "50.0 ms" in auto.decision and not auto.pending
    assert auto.trial is None
    short = ca.AutoCompile(planned=100, device="cuda", warmup=2, probe=3, clock=FakeClock(0.05))
    assert [short.decide(s) for s in range(1, 6)][-1] is False
    assert short.decision is not None and short.decision.startswith("compile auto: off:")


def test_probe_gives_up_on_unknown_length_and_on_runs_shorter_than_the_probe() -> None:
    unknown = ca.AutoCompile(planned=None)
    assert unknown.decide(1) is False and unknown.decision is not None and "unknown" in unknown.decision
    short = ca.AutoCompile(planned=3, warmup=1, probe=5)
    assert [short.decide(s) for s in (1, 2, 3)] == [None, None, False]


def _loader() -> torch.utils.data.DataLoader:
    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


def test_fit_default_is_auto_and_stays_eager_on_a_short_run() -> None:
    assert TrainConfig().compile == "auto"
    model = torch.nn.Linear(4, 2)
    res = fit(
        model, None, _loader(), torch.nn.functional.cross_entropy, TrainConfig(epochs=2, progress=False)
    )
    assert res.steps == 32
    assert str(res.applied["compile"]).startswith("compile auto: off:")


@pytest.mark.usefixtures("cpu_saving")
def test_fit_auto_compiles_mid_run_where_the_rule_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ca, "TRIAL_DEVICES", ())  # the CPU decided by the stated rule, as CUDA is
    monkeypatch.setitem(ca.COMPILE_S, "cpu", 0.0)  # any saving pays: the rule says compile
    compiled: list[torch.nn.Module] = []

    def eager_backend(model: torch.nn.Module) -> torch.nn.Module:
        wrapped = CompiledWithFallback(model, backend="eager")  # dynamo without inductor: fast in tests
        compiled.append(wrapped)
        return wrapped

    monkeypatch.setattr(
        trainer, "maybe_compile", lambda m, enabled=True, **kw: eager_backend(m) if enabled else m
    )
    model = torch.nn.Linear(4, 2)
    before = [p.detach().clone() for p in model.parameters()]
    res = fit(
        model, None, _loader(), torch.nn.functional.cross_entropy, TrainConfig(epochs=3, progress=False)
    )
    assert res.steps == 48 and len(compiled) == 1 and unwrap(compiled[0]) is model
    assert str(res.applied["compile"]).startswith("compile auto: on:")
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("forced", [True, False])
def test_fit_compile_true_or_false_overrides_the_rule(monkeypatch: pytest.MonkeyPatch, forced: bool) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(trainer, "maybe_compile", lambda m, enabled=True, **kw: calls.append(enabled) or m)
    res = fit(
        torch.nn.Linear(4, 2), None, _loader(), torch.nn.functional.cross_entropy,
        TrainConfig(compile=forced, progress=False),
    )  # fmt: skip
    assert calls == [forced] and res.applied["compile"] is forced


def test_fit_rejects_an_unknown_compile_value() -> None:
    with pytest.raises(ValueError, match="compile must be"):
        fit(torch.nn.Linear(4, 2), None, _loader(), torch.nn.functional.cross_entropy,
            TrainConfig(compile="yes", progress=False))  # fmt: skip


def test_progress_note_prints_the_decision_only_when_the_bar_is_on() -> None:
    out = io.StringIO()
    with TrainProgress(10, enabled=True, console=Console(file=out, width=200)) as prog:
        prog.note("compile auto: off: reasons")
    assert "compile auto: off: reasons" in out.getvalue()
    TrainProgress(10, enabled=False).note("nothing to print")  # no bar: silent, no error


def test_fit_says_why_auto_never_decided() -> None:
    """A run stopped before the probe decides stays eager, and applied['compile'] says why."""

    def stop(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise KeyboardInterrupt

    res = fit(torch.nn.Linear(4, 2), None, _loader(), stop, TrainConfig(progress=False))
    assert res.interrupted and res.applied["compile"].startswith("compile auto: undecided (interrupted")


@pytest.mark.usefixtures("cpu_saving")
def test_fit_auto_evaluates_the_uncompiled_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ca, "TRIAL_DEVICES", ())
    monkeypatch.setitem(ca.COMPILE_S, "cpu", 0.0)
    monkeypatch.setattr(
        trainer, "maybe_compile",
        lambda m, enabled=True, **kw: CompiledWithFallback(m, backend="eager") if enabled else m,
    )  # fmt: skip
    evaluated: list[torch.nn.Module] = []
    monkeypatch.setattr(trainer, "evaluate", lambda m, *a: evaluated.append(m) or {"val_loss": 0.0})
    model = torch.nn.Linear(4, 2)
    res = fit(model, None, _loader(), torch.nn.functional.cross_entropy,
              TrainConfig(epochs=2, progress=False), val_loader=_loader())  # fmt: skip
    assert str(res.applied["compile"]).startswith("compile auto: on:") and evaluated == [model, model]


def test_knobs_compile_auto_is_off_until_decided_and_optimizer_impl_is_the_built_one() -> None:
    assert TrainConfig().knobs("cpu").compile is False  # 'auto': decided in the run, not here
    assert TrainConfig(compile=True).knobs("cpu").compile is True
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert (
        TrainConfig().knobs("cpu", optimizer=torch.optim.SGD(p, lr=0.1, foreach=False)).optimizer_impl is None
    )
    assert (
        TrainConfig().knobs("cpu", optimizer=torch.optim.SGD(p, lr=0.1, foreach=True)).optimizer_impl
        == "foreach"
    )
    assert TrainConfig().knobs("cpu").optimizer_impl in ("fused", "foreach")  # fit's own AdamW
    assert not TrainConfig(tf32=True, cudnn_benchmark=True).knobs("cpu").tf32  # CUDA only
