"""CUDA-only paths exercised on CPU with fakes: the prefetcher's stream choreography, the fp16 scaler."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from pitstop.train import prefetch
from pitstop.train.amp import Amp


class _FakeStream:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def wait_stream(self, other: _FakeStream) -> None:
        self.log.append(f"{self.name} waits {other.name}")


def test_prefetcher_copies_next_batch_on_side_stream_before_handing_out_current(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    side = _FakeStream(log, "side")
    main = _FakeStream(log, "main")
    active = {"stream": "main"}

    @contextlib.contextmanager
    def stream_ctx(s: _FakeStream) -> Any:
        active["stream"] = s.name
        yield
        active["stream"] = "main"

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: side)
    monkeypatch.setattr(torch.cuda, "stream", stream_ctx)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(prefetch, "_pin", lambda b: (log.append(f"pin {int(b[0])}"), b)[1])

    def fake_move(b: Any, device: torch.device, non_blocking: bool = False) -> Any:
        assert device.type == "cuda" and non_blocking
        log.append(f"copy {int(b[0])} on {active['stream']}")
        return b

    monkeypatch.setattr(prefetch, "move_to", fake_move)
    monkeypatch.setattr(
        prefetch, "_record_stream", lambda b, s: log.append(f"record {int(b[0])} on {s.name}")
    )

    batches = [torch.tensor([i]) for i in range(3)]
    for b in prefetch.DevicePrefetcher(batches, "cuda"):
        log.append(f"compute {int(b[0])}")
    assert log == [
        "pin 0", "copy 0 on side",
        "main waits side", "record 0 on main", "pin 1", "copy 1 on side", "compute 0",
        "main waits side", "record 1 on main", "pin 2", "copy 2 on side", "compute 1",
        "main waits side", "record 2 on main", "compute 2",
    ]  # fmt: skip


def _fp16_amp() -> Amp:
    # The fp16 + GradScaler path as it runs on CUDA, here on CPU (torch has a CPU GradScaler).
    return Amp(torch.device("cpu"), torch.float16, torch.amp.GradScaler("cpu", init_scale=2.0**10))


def test_fp16_scaler_skips_steps_with_inf_gradients_and_lowers_the_scale() -> None:
    amp = _fp16_amp()
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    amp.backward((w * torch.tensor([float("inf"), 1.0])).sum())
    amp.step(opt)
    assert torch.equal(w.detach(), torch.ones(2))  # step skipped
    assert amp.scaler.get_scale() == 2.0**9
    amp.backward((w * 2).sum())
    amp.step(opt, clip_norm=10.0)
    torch.testing.assert_close(w.detach(), torch.full((2,), 0.8))  # true grads (2, 2), unscaled
    assert w.grad is None


def test_fp16_autocast_forward_dtype() -> None:
    amp = _fp16_amp()
    with amp.autocast():
        assert torch.nn.Linear(2, 2)(torch.randn(1, 2)).dtype is torch.float16
    assert amp.name == "fp16"


def test_nvtx_ranges_push_and_pop_when_cuda_is_present(monkeypatch: pytest.MonkeyPatch) -> None:
    from pitstop.train.progress import nvtx_range

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(f"push {name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    with pytest.raises(RuntimeError), nvtx_range("forward"):
        raise RuntimeError("step failed")  # the range is closed even when the step raises
    with nvtx_range("backward", enabled=False):
        pass
    assert calls == ["push forward", "pop"]


def test_configure_backends_sets_tf32_and_cudnn_benchmark_only_for_cuda() -> None:
    from pitstop.train.backends import configure_backends

    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.get_float32_matmul_precision(),
    )
    try:
        torch.backends.cudnn.benchmark = False
        assert configure_backends("cpu") == {}
        assert torch.backends.cudnn.benchmark is False
        assert configure_backends("cuda:0") == {"tf32": True, "cudnn_benchmark": True}
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert torch.backends.cudnn.benchmark is True
        configure_backends("cuda", tf32=False, cudnn_benchmark=False)
        assert not torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
    finally:
        (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark,
        ) = saved[:3]
        torch.set_float32_matmul_precision(saved[3])
