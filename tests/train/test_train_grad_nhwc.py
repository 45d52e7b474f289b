"""channels_last in training: global pooling's backward hands the gradient on in NHWC, values unchanged."""

from __future__ import annotations

import pytest
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
    assert len(channels_last.keep_grad_nhwc(hooked)) == 2  # the pooling and the Flatten
    assert channels_last.keep_grad_nhwc(hooked) == []  # already hooked: not twice
    x = channels_last.apply_input(torch.randn(4, 3, 6, 6))
    seen: list[torch.Tensor] = []
    hooked[2].register_full_backward_hook(lambda m, gin, gout: seen.append(gout[0]))  # ReLU's incoming grad
    for m in (plain, hooked):
        m(x).square().sum().backward()
    assert seen and seen[0].is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_keep_grad_nhwc_hooks_stay_out_of_a_compiled_graph() -> None:
    """Under dynamo the hooks do nothing: the model traces as one graph (their identity broke it in
    three on the benchmark net, and compile lost its saving); eagerly they still act."""
    import torch._dynamo as dynamo

    hooked = _net()
    channels_last.apply_model(hooked)
    assert len(channels_last.keep_grad_nhwc(hooked)) == 2
    x = channels_last.apply_input(torch.randn(4, 3, 6, 6).requires_grad_())
    explained = dynamo.explain(hooked)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    dynamo.reset()


def test_keep_grad_nhwc_at_a_flatten_head_keeps_gradients_equal() -> None:
    def net() -> torch.nn.Sequential:
        torch.manual_seed(0)
        conv = [torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU()]
        return torch.nn.Sequential(*conv, torch.nn.Flatten(), torch.nn.Linear(4 * 5 * 5, 2))

    plain, hooked = channels_last.apply_model(net()), channels_last.apply_model(net())
    assert len(channels_last.keep_grad_nhwc(hooked)) == 1
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
    assert channels_last.keep_grad_nhwc(torch.nn.Linear(2, 2)) == []


def _loader() -> torch.utils.data.DataLoader:
    x, y = torch.randn(8, 3, 6, 6), torch.randint(0, 2, (8,))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_fit_hooks_while_it_trains_and_hands_the_model_back_without_them() -> None:
    seen: list[int] = []

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.append(len(model[3]._forward_pre_hooks) + len(model[4]._forward_pre_hooks))
        return torch.nn.functional.cross_entropy(out, y)

    model = _net()
    fit(model, None, _loader(), loss, TrainConfig(progress=False, precision="fp32"))
    assert seen and set(seen) == {2}  # the pooling and the Flatten, while fit ran
    assert not any(m._forward_pre_hooks for m in model.modules())
    torch.jit.script(model)  # the hook (a Python autograd.Function) would not script


def test_fit_removes_its_hooks_when_the_loop_raises() -> None:
    def boom(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("user loss failed")

    model = _net()
    with pytest.raises(RuntimeError, match="user loss failed"):
        fit(model, None, _loader(), boom, TrainConfig(progress=False, precision="fp32"))
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_flatten_from_dim_2_is_not_hooked_and_an_inplace_op_after_it_trains() -> None:
    """Flatten(start_dim=2) of the identity's view is a view: hooked, an in-place op after it would
    raise; it is left alone."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.Flatten(start_dim=2),
        torch.nn.ReLU(inplace=True),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 36, 2),
    )
    hooked = channels_last.keep_grad_nhwc(channels_last.apply_model(model))
    assert len(hooked) == 1 and model[3]._forward_pre_hooks  # only the Flatten from dim 1 (its input: 3-D)
    hooked[0].remove()
    res = fit(model, None, _loader(), torch.nn.functional.cross_entropy,
              TrainConfig(progress=False, precision="fp32", channels_last=True))  # fmt: skip
    assert res.steps == 2 and res.applied["channels_last"] is True
