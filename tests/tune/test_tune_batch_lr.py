"""Batch-size finder (CPU memory budget, CUDA OOM recovery with a fake allocator) and the LR range test."""

from __future__ import annotations

import collections
import itertools
import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pitstop.findings import Severity
from pitstop.tune import batch_size as bsmod
from pitstop.tune.batch_size import BatchSizeResult, CudaMeter, batch_size_findings, find_batch_size
from pitstop.tune.lr import LRResult, lr_findings, lr_range_test, lr_schedule, suggest
from pitstop.tune.reports import batch_size_report, lr_report

torch.set_num_threads(1)
MiB = 2**20


def wide_mlp() -> torch.nn.Module:
    # ~0.3 MiB of activations and their gradients per sample, little compute: memory grows with the batch.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 16384), torch.nn.ReLU(), torch.nn.Linear(16384, 1))


def regression_batch(bs: int):
    return torch.randn(bs, 32), torch.randn(bs, 1)


def params_of(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# ----------------------------------------------------------------------------------------- batch size


def test_cpu_budget_stops_below_the_budget_and_restores_the_model():
    model = wide_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = params_of(model)
    budget = 40 * MiB
    r = find_batch_size(model, regression_batch, opt, budget_bytes=budget, start=8)
    assert r.best is not None and r.best >= 8
    best = next(t for t in r.trials if t.batch_size == r.best and t.fits)  # (a size may be re-tried)
    assert best.peak_bytes <= budget
    # Something just above the answer was found not to fit (measured or predicted), so it is the largest.
    assert any(not t.fits and t.batch_size > r.best for t in r.trials)
    measured = [t.peak_bytes for t in r.trials if t.status in ("fits", "over_budget")]
    assert max(measured) <= 1.5 * budget  # never far past the budget: extrapolation stops it
    assert all(t.samples_per_s and t.samples_per_s > 0 for t in r.trials if t.fits)
    # Memory really grows with batch size on this model.
    fits = sorted((t for t in r.trials if t.fits), key=lambda t: t.batch_size)
    assert fits[-1].peak_bytes > fits[0].peak_bytes
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    f = batch_size_findings(r)[0]
    assert f.id == "tune.batch_size.best" and f.data["best"] == r.best


def test_cpu_peaks_are_repeatable() -> None:
    # The CPU measure is the tracker's tensor bytes, not RSS, so malloc's state (another search before,
    # pitstop.train's mallopt) does not move the answer: two searches give the same sizes and peaks.
    runs = []
    for _ in range(2):
        model = wide_mlp()
        r = find_batch_size(
            model,
            regression_batch,
            torch.optim.SGD(model.parameters(), lr=0.01),
            budget_bytes=40 * MiB,
            start=8,
        )
        runs.append([(t.batch_size, t.status, t.peak_bytes) for t in r.trials])
    assert runs[0] == runs[1]
    # Roughly linear in the batch: 8x the samples costs between 4x and 8x the bytes (parameter grads fixed).
    peak = {bs: p for bs, st, p in runs[0] if st == "fits"}
    assert 4 * peak[16] < peak[128] <= 8 * peak[16]


class FakeCuda:
    """A fake CUDA allocator: each sample costs 1 MiB; above ``capacity`` the step raises OOM."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capacity: int) -> None:
        self.capacity, self.peak, self.empty_cache_calls = capacity, 0, 0
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: 0)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: self.peak)
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)

    def reset(self, *a: object) -> None:
        self.peak = 0

    def empty_cache(self) -> None:
        self.empty_cache_calls += 1

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        x, y = batch
        need = x.shape[0] * MiB
        if need > self.capacity:
            self.peak = self.capacity
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        self.peak = max(self.peak, need)
        return torch.nn.functional.mse_loss(model(x), y)


def test_cuda_oom_is_recovered_and_bisection_finds_the_edge(monkeypatch):
    fake = FakeCuda(monkeypatch, capacity=40 * MiB)
    model = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = params_of(model)
    r = find_batch_size(
        model, regression_batch, opt, fake.loss, budget_bytes=10**12, start=2, meter=CudaMeter("cuda")
    )
    assert r.best == 40
    ooms = [t for t in r.trials if t.status == "oom"]
    assert ooms and "out of memory" in ooms[0].reason
    assert fake.empty_cache_calls >= len(r.trials)  # cleaned up after every size, OOM or not
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert r.memory_measure == "cuda max_memory_allocated"


def test_cuda_budget_below_capacity(monkeypatch):
    fake = FakeCuda(monkeypatch, capacity=10**12)
    model = torch.nn.Linear(32, 1)
    r = find_batch_size(
        model, regression_batch, None, fake.loss, budget_bytes=24 * MiB, start=4, meter=CudaMeter("cuda")
    )
    assert r.best == 24
    assert not any(t.status == "oom" for t in r.trials)


def test_a_failing_loss_is_reported_not_raised():
    def bad_loss(model, batch):
        raise ValueError("targets have the wrong shape")

    r = find_batch_size(torch.nn.Linear(32, 1), regression_batch, loss_fn=bad_loss, budget_bytes=MiB)
    assert r.best is None
    f = batch_size_findings(r)[0]
    assert f.id == "tune.batch_size.error" and f.severity is Severity.ERROR
    assert "wrong shape" in f.evidence


def test_batch_size_report_and_round_trip():
    import json

    r = BatchSizeResult(best=64, budget_bytes=100 * MiB, device="cpu", memory_measure=bsmod.CpuMeter.name)
    r.trials = [
        bsmod.BatchTrial(32, "fits", 40 * MiB, 0.01, 3200.0),
        bsmod.BatchTrial(64, "fits", 80 * MiB, 0.03, 2100.0),
        bsmod.BatchTrial(128, "predicted_over", 160 * MiB, reason="predicted peak 160 MiB > budget"),
    ]
    back = BatchSizeResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.trials[1].peak_bytes == 80 * MiB
    report, blocks = batch_size_report(back)
    ids = {f.id for f in report.findings}
    assert ids == {"tune.batch_size.best", "tune.batch_size.throughput"}  # 32 is faster than 64
    assert "predicted" in report.by_id("tune.batch_size.best").evidence
    assert blocks


# ------------------------------------------------------------------------------------------------- lr


def digits_loader(batch_size: int = 64) -> DataLoader:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    ds = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))
    return DataLoader(ds, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))


def digits_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def test_schedule_is_exponential():
    lrs = lr_schedule(1e-6, 1.0, 7)
    assert lrs[0] == pytest.approx(1e-6) and lrs[-1] == pytest.approx(1.0)
    assert all(b / a == pytest.approx(10.0) for a, b in itertools.pairwise(lrs))


def test_suggestion_on_a_known_curve():
    lrs = lr_schedule(1e-5, 1.0, 51)
    # U-shaped in log10(lr) with its minimum at lr = 1e-2 and the steepest fall around 1e-3.5.
    smoothed = [
        2.0 - math.tanh(2 * (math.log10(lr) + 3.5)) + max(0.0, math.log10(lr) + 2) ** 2 * 5 for lr in lrs
    ]
    s = suggest(lrs, smoothed)
    assert s["min_loss_lr"] == pytest.approx(1e-2, rel=0.3)
    assert s["suggested_max_lr"] == pytest.approx(s["min_loss_lr"] / 10)
    assert s["cyclic_base_lr"] == pytest.approx(s["suggested_max_lr"] / 4)
    assert 10**-4 < s["steepest_lr"] < 10**-3


def test_no_descent_gives_no_rate():
    lrs = lr_schedule(1e-5, 1.0, 51)
    # a dip after the start that never gets below the first logged loss (2.253): no descent
    smoothed = [2.4 - 0.08 * math.exp(-((math.log10(lr) + 2.5) ** 2)) for lr in lrs]
    s = suggest(lrs, smoothed, first_loss=2.253)
    assert s["min_loss_lr"] == pytest.approx(10**-2.5, rel=0.3)
    assert s["suggested_max_lr"] is None and s["cyclic_max_lr"] is None
    assert suggest(lrs, smoothed, first_loss=2.5)["suggested_max_lr"] is not None  # below it: a descent
    rising = [1.0 + i for i in range(len(lrs))]  # the minimum is the first step
    assert suggest(lrs, rising)["suggested_max_lr"] is None
    res = LRResult(lrs=lrs, losses=[2.253, *smoothed[1:]], smoothed=smoothed, settings={"start_lr": 1e-5})
    for k, v in s.items():
        setattr(res, k, v)
    (f,) = lr_findings(res)
    assert f.severity is Severity.WARN and f.title.startswith("No descent found")
    assert "2.253" in f.evidence and "2.32" in f.evidence and not f.fix_code


def test_range_test_restores_state_diverges_and_suggests():
    model = digits_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = digits_loader()
    for x, y in list(loader)[:3]:  # optimizer state (momentum buffers) exists before the test
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    before = params_of(model)
    before_opt = {k: v["momentum_buffer"].clone() for k, v in opt.state.items()}
    r = lr_range_test(model, loader, opt, start_lr=1e-4, end_lr=100.0, num_steps=80)
    assert r.stop in ("diverged", "non-finite")
    assert len(r.lrs) < 80
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(torch.equal(before_opt[k], v["momentum_buffer"]) for k, v in opt.state.items())
    assert opt.param_groups[0]["lr"] == 0.05
    assert r.min_loss_lr is not None and 1e-4 < r.min_loss_lr < r.lrs[-1]
    assert r.suggested_max_lr == pytest.approx(r.min_loss_lr / 10)
    # the smoothed loss really came down before diverging
    assert min(r.smoothed) < 0.8 * r.smoothed[0]
    f = lr_findings(r)[0]
    assert f.id == "tune.lr.suggestion" and "OneCycleLR" in (f.fix_code or "")


def test_non_finite_loss_stops_and_restores():
    model = digits_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = params_of(model)
    calls = {"n": 0}

    def loss_fn(m, batch):
        calls["n"] += 1
        x, y = batch
        loss = torch.nn.functional.cross_entropy(m(x), y)
        return loss * float("nan") if calls["n"] == 10 else loss

    r = lr_range_test(model, digits_loader(), opt, loss_fn, num_steps=50)
    assert r.stop == "non-finite" and len(r.lrs) == 10
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_short_loader_is_cycled():
    ds = TensorDataset(torch.randn(8, 64), torch.randint(0, 10, (8,)))
    model = digits_model()
    opt = torch.optim.SGD(model.parameters(), lr=1)
    r = lr_range_test(model, DataLoader(ds, batch_size=4), opt, start_lr=1e-6, end_lr=1e-3, num_steps=9)
    assert len(r.lrs) == 9 and r.stop == "completed"  # 2 batches per pass, 9 steps


def test_namedtuple_batches_reach_the_loss_as_namedtuples():
    """Batches are moved to the model's device field by field, keeping a namedtuple's type."""
    Batch = collections.namedtuple("Batch", "x y")
    batches = [Batch(torch.randn(4, 64), torch.randint(0, 10, (4,))) for _ in range(3)]
    seen = []

    def loss_fn(model, batch):
        seen.append(type(batch))
        return torch.nn.functional.cross_entropy(model(batch.x), batch.y)

    model = digits_model()
    opt = torch.optim.SGD(model.parameters(), lr=1)
    r = lr_range_test(model, batches, opt, loss_fn, start_lr=1e-6, end_lr=1e-3, num_steps=5)
    assert r.error is None and r.stop == "completed" and len(r.lrs) == 5
    assert seen and all(t is Batch for t in seen)


def test_lr_report_plot_and_round_trip(tmp_path):
    import json

    from pitstop.report.html import render_html
    from pitstop.tune.plot import save_line_png

    model = digits_model()
    r = lr_range_test(
        model, digits_loader(), torch.optim.Adam(model.parameters()), start_lr=1e-5, end_lr=10, num_steps=40
    )
    back = LRResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.suggested_max_lr == r.suggested_max_lr
    report, blocks = lr_report(back)
    html = render_html(report, blocks)
    assert "<svg" in html and "polyline" in html
    png = save_line_png(tmp_path / "lr.png", r.lrs, {"loss": r.smoothed}, logx=True, marks={"max_lr": 1e-3})
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batchnorm_models_are_searched_without_a_size_one_batch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 1))
    r = find_batch_size(model, regression_batch, budget_bytes=2**30, start=2, max_batch_size=16)
    assert r.best == 16 and [t.batch_size for t in r.trials] == [2, 4, 8, 16]
    assert model.training


def test_a_failing_loss_in_the_lr_test_is_a_finding_and_state_is_restored():
    model = digits_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = params_of(model)

    def bad(m, batch):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    r = lr_range_test(model, digits_loader(), opt, bad, num_steps=10)
    assert r.stop == "error" and "shapes" in r.error
    (f,) = lr_findings(r)
    assert f.id == "tune.lr.error" and f.severity is Severity.ERROR
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert opt.param_groups[0]["lr"] == 0.1
