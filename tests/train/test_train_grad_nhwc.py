"""channels_last in training: global pooling's backward hands the gradient on in NHWC, values unchanged."""

from __future__ import annotations

import torch

from pitstop.recipes import channels_last
from pitstop.train import TrainConfig, fit


def _net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 2),
    )


def test_keep_grad_nhwc_hooks_global_pooling_once_and_keeps_gradients_equal() -> None:
    plain, hooked = _net(), _net()
    for m in (plain, hooked):
        channels_last.apply_model(m)
    assert channels_last.keep_grad_nhwc(hooked) == 2  # the pooling and the Flatten
    assert channels_last.keep_grad_nhwc(hooked) == 0  # already hooked: not twice
    x = channels_last.apply_input(torch.randn(4, 3, 6, 6))
    seen: list[torch.Tensor] = []
    hooked[2].register_full_backward_hook(lambda m, gin, gout: seen.append(gout[0]))  # ReLU's incoming grad
    for m in (plain, hooked):
        m(x).square().sum().backward()
    assert seen and seen[0].is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_keep_grad_nhwc_at_a_flatten_head_keeps_gradients_equal() -> None:
    def net() -> torch.nn.Sequential:
        torch.manual_seed(0)
        conv = [torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU()]
        return torch.nn.Sequential(*conv, torch.nn.Flatten(), torch.nn.Linear(4 * 5 * 5, 2))

    plain, hooked = channels_last.apply_model(net()), channels_last.apply_model(net())
    assert channels_last.keep_grad_nhwc(hooked) == 1
    seen: list[torch.Tensor] = []
    hooked[1].register_full_backward_hook(lambda m, gin, gout: seen.append(gout[0]))
    x = channels_last.apply_input(torch.randn(3, 3, 5, 5))
    for m in (plain, hooked):
        m(x).square().sum().backward()
    assert seen[0].is_contiguous(memory_format=torch.channels_last) and not seen[0].is_contiguous()
    for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_keep_grad_nhwc_leaves_nchw_inputs_and_models_without_pooling_alone() -> None:
    model = _net()
    channels_last.keep_grad_nhwc(model)
    out = model(torch.randn(2, 3, 5, 5))  # NCHW input: the hook passes it through
    out.sum().backward()
    assert channels_last.keep_grad_nhwc(torch.nn.Linear(2, 2)) == 0


def test_fit_hooks_global_pooling_only_when_channels_last_is_on() -> None:
    x, y = torch.randn(8, 3, 6, 6), torch.randint(0, 2, (8,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    on, off = _net(), _net()
    fit(on, None, loader, torch.nn.functional.cross_entropy, TrainConfig(progress=False, precision="fp32"))
    fit(off, None, loader, torch.nn.functional.cross_entropy,
        TrainConfig(progress=False, precision="fp32", channels_last=False))  # fmt: skip
    assert len(on[3]._forward_pre_hooks) == 1 and not off[3]._forward_pre_hooks
    assert len(on[4]._forward_pre_hooks) == 1  # the Flatten (a no-op there: its input is 1x1)
