"""compile='auto' on a CPU: the measured trial (compile, then interleaved eager and compiled blocks) that
keeps compiled only where it measures faster and pays back its compilation. Fake clocks: no timing."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pitstop.train import TrainConfig, fit, trainer, unwrap
from pitstop.train import compile_auto as ca


class StepClock:
    """Each read ends one step: eager or compiled (``compiled``, what the last ``decide`` returned, or with
    ``per_read``, whether the compiled module ran since the last read), the first compiled step also
    paying the compilation; a small deterministic jitter so the interval has a width."""

    def __init__(self, eager_s: float, compiled_s: float, compile_s: float, per_read: bool = False) -> None:
        self.t, self.eager_s, self.compiled_s, self.compile_s = 0.0, eager_s, compiled_s, compile_s
        self.compiled, self.compiled_before, self.reads, self.per_read = False, False, 0, per_read

    def __call__(self) -> float:
        self.reads += 1
        jitter = 1 + 0.01 * (self.reads * 7 % 5 - 2)
        self.t += jitter * (self.compiled_s if self.compiled else self.eager_s)
        if self.compiled and not self.compiled_before:
            self.t += self.compile_s
            self.compiled_before = True
        if self.per_read:
            self.compiled = False
        return self.t


def drive(auto: ca.AutoCompile, clock: StepClock, steps: int) -> list[bool | None]:
    """``decide`` after each of ``steps`` steps, switching the clock's model as ``decide`` says."""
    got = []
    for step in range(1, steps + 1):
        use = auto.decide(step)
        got.append(use)
        if use is not None:
            clock.compiled = use
        if auto.decision is not None:
            break
    return got


def test_plan_trial_is_bounded_in_seconds_and_in_share_of_the_run() -> None:
    assert ca.plan_trial(10**6, 0.05) == (5, 60)  # 60 rounds of 2 x 5 steps: 30 s of 50 ms steps
    assert ca.plan_trial(10**6, 0.3) == (5, 10)  # 10 rounds of 2 x 5 steps: 30 s of 300 ms steps
    assert ca.plan_trial(10**6, 0.001) == (5, ca.TRIAL_ROUNDS)  # fast steps: the rounds' cap
    assert ca.plan_trial(10**6, 2.0) == (2, ca.MIN_ROUNDS)  # slow steps: the fewest rounds, short blocks
    assert ca.plan_trial(100, 0.01) is None  # 5% of 100 steps holds no 3 rounds
    block, rounds = ca.plan_trial(1000, 0.001) or (0, 0)
    assert 2 * block * rounds <= ca.TRIAL_SHARE * 1000


@pytest.mark.parametrize("eager_s", [0.05, 2.0])
def test_trial_keeps_compiled_where_it_is_faster_and_pays_back(eager_s: float) -> None:
    clock = StepClock(eager_s, 0.8 * eager_s, compile_s=30.0)
    auto = ca.AutoCompile(planned=10**6, warmup=2, probe=3, clock=clock)
    got = drive(auto, clock, 10**4)
    assert got[:4] == [None] * 4 and got[4] is True  # probe, then compile for the trial
    assert auto.trial is not None and auto.started is not None and "trial:" in auto.started
    assert auto.compile and got[-1] is True and auto.decision is not None
    assert auto.decision.startswith("compile auto: on: trial helped: ")
    # the compilation: the first compiled step over an eager one
    assert auto.compile_s is not None and 29 < auto.compile_s < 31
    for words in ("ms vs compiled", "CI", "; compilation ", "break-even", "steps left"):
        assert words in auto.decision
    block, rounds = ca.plan_trial(10**6 - 5, eager_s) or (0, 0)
    trial_steps = len(got) - 6  # past the probe's 5 and the compiling step
    assert trial_steps <= 2 * block * rounds and trial_steps % (2 * block) == 0
    assert auto.trial.eager.steps == auto.trial.compiled.steps  # both arms alike, every step a real one


def test_trial_goes_back_to_eager_where_compiled_is_slower() -> None:
    clock = StepClock(0.05, 0.06, compile_s=30.0)
    auto = ca.AutoCompile(planned=10**6, warmup=2, probe=3, clock=clock)
    got = drive(auto, clock, 10**4)
    assert got[-1] is False and not auto.compile and auto.decision is not None
    assert auto.decision.startswith("compile auto: off: trial hurt: ") and "back to eager" in auto.decision
    assert True in got  # it did run compiled steps


def test_trial_that_helps_but_cannot_pay_back_its_compilation_goes_back_to_eager() -> None:
    clock = StepClock(0.05, 0.04, compile_s=10**5)  # 10 ms a step saved, 100,000 s spent compiling
    auto = ca.AutoCompile(planned=10**6, warmup=2, probe=3, clock=clock)
    got = drive(auto, clock, 10**4)
    assert got[-1] is False and auto.decision is not None
    assert auto.decision.startswith("compile auto: off: trial helped but too few steps left")


def test_short_run_starts_no_trial_and_unknown_length_stays_eager() -> None:
    clock = StepClock(0.05, 0.01, compile_s=1.0)
    auto = ca.AutoCompile(planned=1000, warmup=2, probe=3, clock=clock)  # 1000 x 50 ms x 5% < 60 s
    assert drive(auto, clock, 100) == [None] * 4 + [False]
    assert auto.trial is None and auto.decision is not None and "off: no trial:" in auto.decision
    unknown = ca.AutoCompile(planned=None)
    assert unknown.decide(1) is False and unknown.trial is None


def test_a_compilation_that_fell_back_ends_the_trial() -> None:
    clock = StepClock(0.05, 0.04, compile_s=1.0)
    auto = ca.AutoCompile(planned=10**6, warmup=2, probe=3, clock=clock)
    assert drive(auto, clock, 5)[-1] is True
    assert auto.decide(6, failed=RuntimeError("inductor")) is False
    assert auto.decision is not None and "compilation failed (RuntimeError: inductor)" in auto.decision


# ----------------------------------------------------------------------------------------- through fit


class FakeCompiled(torch.nn.Module):
    """Stands in for ``torch.compile``'s wrapper: the same module's forward, telling the clock it ran."""

    def __init__(self, model: torch.nn.Module, clock: StepClock) -> None:
        super().__init__()
        self._orig_mod, self.clock = model, clock  # ``_orig_mod``: unwrap finds the model under it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.compiled = True
        return self._orig_mod(x)


def _fit(monkeypatch: pytest.MonkeyPatch, compiled_s: float | None) -> tuple[Any, torch.nn.Module]:
    """fit over 80 steps with a fake compile and clock (``compiled_s`` None: compile=False)."""
    clock = StepClock(0.05, compiled_s or 0.05, compile_s=0.5, per_read=True)

    def fake_compile(m: torch.nn.Module, enabled: bool = True, **kw: Any) -> torch.nn.Module:
        return FakeCompiled(m, clock) if enabled else m

    def auto(cfg: TrainConfig, env: Any, planned: int | None) -> ca.AutoCompile | None:
        if cfg.compile != "auto":
            return None
        return ca.AutoCompile(planned, env.device.type, warmup=2, probe=3, clock=clock)

    monkeypatch.setattr(trainer, "maybe_compile", fake_compile)
    monkeypatch.setattr(trainer, "_auto", auto)
    monkeypatch.setitem(ca.COMPILE_S, "cpu", 0.01)  # the trial may start on this short run
    monkeypatch.setattr(ca, "TRIAL_SHARE", 0.5)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(64, 4), (torch.arange(64) % 2)
    x[:, 0] += y * 2.0  # a learnable signal: the loss falls
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    cfg = TrainConfig(
        epochs=5, progress=False, compile="auto" if compiled_s else False, lr=0.05, log_every=16
    )
    return fit(model, None, loader, torch.nn.functional.cross_entropy, cfg), model


@pytest.mark.parametrize(("compiled_s", "kept"), [(0.03, True), (0.08, False)])
def test_fit_trial_keeps_or_reverts_and_trains_as_eager_does(
    monkeypatch: pytest.MonkeyPatch, compiled_s: float, kept: bool
) -> None:
    res, model = _fit(monkeypatch, compiled_s)
    plain, eager_model = _fit(monkeypatch, None)
    decision = str(res.applied["compile"])
    assert decision.startswith("compile auto: on: trial helped" if kept else "compile auto: off: trial hurt")
    assert res.steps == plain.steps == 80
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        assert torch.equal(p, q)  # every trial step was a real step, on the same parameters
    assert res.history[-1]["loss"] < res.history[0]["loss"]
    assert unwrap(model) is model


@pytest.mark.slow
def test_fit_trial_with_a_real_compilation(monkeypatch: pytest.MonkeyPatch) -> None:
    """inductor on a tiny MLP (15-35 s, most of it compiling): the trial runs to a decision, either way,
    and the run trains all its steps."""
    if not hasattr(torch, "compile"):
        pytest.skip("no torch.compile")
    monkeypatch.setitem(ca.COMPILE_S, "cpu", 0.001)  # the trial may start on this short run
    monkeypatch.setattr(ca, "TRIAL_SHARE", 0.5)
    made: list[ca.AutoCompile] = []

    def auto(cfg: TrainConfig, env: Any, planned: int | None) -> ca.AutoCompile:
        made.append(ca.AutoCompile(planned, env.device.type, warmup=2, probe=5))
        return made[-1]

    monkeypatch.setattr(trainer, "_auto", auto)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(64, 8), torch.arange(64) % 2
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    res = fit(model, None, loader, torch.nn.functional.cross_entropy, TrainConfig(epochs=20, progress=False))
    assert res.steps == 160 and made[0].trial is not None and made[0].compile_s is not None
    assert str(res.applied["compile"]).startswith(("compile auto: on: trial", "compile auto: off: trial"))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
