from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pitstop.host import precision as host_precision
from pitstop.train import amp as amp_mod
from pitstop.train.amp import Amp, clip_gradients, make_grad_scaler, resolve_precision


def test_auto_follows_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amp_mod.matmul, "cpu_bf16_check", lambda: SimpleNamespace(slower=False))
    monkeypatch.setattr(host_precision, "preferred_amp_dtype", lambda dev: "bfloat16")
    assert resolve_precision("auto", "cpu") is torch.bfloat16
    monkeypatch.setattr(host_precision, "preferred_amp_dtype", lambda dev: None)
    assert resolve_precision("auto", "cpu") is None
    monkeypatch.setattr(host_precision, "preferred_amp_dtype", lambda dev: "float16")
    assert resolve_precision("auto", "cuda") is torch.float16


def test_auto_stays_fp32_on_a_cpu_without_bf16_hardware(bf16less_cpu, monkeypatch) -> None:
    """On an AVX2-only CPU bf16 is emulated (a 14x slow-down measured there): auto must not pick it, and
    it decides from the flags alone, without running a matmul. Flags that name bf16 hardware are
    confirmed by a measurement: bf16 where its torch.mm is no slower than fp32's."""
    from pitstop.host import cpu as hardware

    assert resolve_precision("auto", "cpu") is None and not bf16less_cpu
    monkeypatch.setattr(hardware, "_host_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    monkeypatch.setattr(amp_mod.matmul, "cpu_bf16_check", lambda: SimpleNamespace(slower=False))
    assert resolve_precision("auto", "cpu") is torch.bfloat16


def test_auto_measures_what_bf16_flags_promise(bf16less_cpu, monkeypatch) -> None:
    """bf16 flags with emulated kernels (``ONEDNN_MAX_CPU_ISA=AVX2`` on an AVX512_BF16 EPYC: bf16 torch.mm
    68x slower than fp32): the measurement overrules the flags, and auto stays fp32."""
    from pitstop.host import cpu as hardware

    monkeypatch.setattr(hardware, "_host_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert resolve_precision("auto", "cpu") is None
    assert {dtype for dtype, _, _ in bf16less_cpu} == {"float32", "bfloat16"}
    assert resolve_precision("bf16", "cpu") is torch.bfloat16  # asked for by name: as asked


def test_explicit_precisions() -> None:
    assert resolve_precision("fp32", "cpu") is None
    assert resolve_precision("bf16", "cpu") is torch.bfloat16
    assert resolve_precision("fp16", "cuda") is torch.float16
    with pytest.raises(ValueError, match="CUDA"):
        resolve_precision("fp16", "cpu")
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("int3", "cpu")


def test_scaler_only_for_fp16_on_cuda() -> None:
    assert make_grad_scaler("cpu", torch.bfloat16) is None
    assert make_grad_scaler("cuda", torch.bfloat16) is None
    assert make_grad_scaler("cpu", None) is None


def test_bf16_autocast_runs_matmul_in_bf16_and_fp32_does_not() -> None:
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with Amp.create("bf16", "cpu").autocast():
        assert lin(x).dtype is torch.bfloat16
    with Amp.create("fp32", "cpu").autocast():
        assert lin(x).dtype is torch.float32


def test_clip_unscales_before_clipping() -> None:
    # A real GradScaler (CPU) multiplies the loss by 1024; clipping must see the true gradient norm.
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = torch.optim.SGD([w], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale((w * torch.tensor([3.0, 4.0])).sum()).backward()  # true grad (3, 4): norm 5
    norm = clip_gradients(opt, max_norm=1.0, scaler=scaler)
    assert norm is not None and float(norm) == pytest.approx(5.0)
    torch.testing.assert_close(w.grad, torch.tensor([0.6, 0.8]))
    scaler.step(opt)  # already unscaled: the step uses the clipped grads
    torch.testing.assert_close(w.detach(), torch.tensor([2.4, 3.2]))


def test_amp_step_steps_and_clears_grads() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.5)
    a = Amp.create("fp32", "cpu")
    with a.autocast():
        loss = (w * 2).sum()
    a.backward(loss)
    a.step(opt, clip_norm=None)
    torch.testing.assert_close(w.detach(), torch.zeros(3))
    assert w.grad is None  # set_to_none
    assert a.name == "fp32"
