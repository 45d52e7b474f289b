"""Turn structured-pruning zeros into a smaller model: remove dead output channels for real.

Structured pruning leaves zeroed rows in dense weights, which costs the same bytes and time. Where a
layer's output feeds the next Linear/Conv directly (inside an ``nn.Sequential``, through elementwise
activations, dropout, per-channel pooling or BatchNorm; a conv also through a ``Flatten`` into a
Linear), a channel whose weights are all zero produces a
constant: we fold that constant into the next layer's bias and delete the channel from both layers. The
function computed is unchanged (checked in the tests to float precision). Channels in any other
position (a residual add, the model output, outside a plain Sequential) are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_ADAPTIVE = (
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
)
_POOLS = (
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
)
# Modules that act on each channel independently and map a constant channel to a constant.
_PASS = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.GELU,
    nn.SiLU,
    nn.ELU,
    nn.Tanh,
    nn.Sigmoid,
    nn.Hardswish,
    nn.Hardtanh,
    nn.Identity,
    nn.Dropout,
    *_POOLS,
    *_ADAPTIVE,
)


@dataclass(frozen=True)
class Shrunk:
    channels_removed: int
    channels_total: int  # output channels of the layers that had a removable position
    layers_changed: int


def _passes(m: nn.Module) -> bool:
    """Maps each channel on its own, a constant channel to one constant (padded pools do not: the
    padding changes border values), BatchNorm only with running statistics."""
    if isinstance(m, _POOLS):
        pad = m.padding
        return all(p == 0 for p in (pad if isinstance(pad, tuple) else (pad,)))
    if isinstance(m, _NORMS):
        return m.track_running_stats and m.running_mean is not None
    return isinstance(m, _PASS)


def _same_kind(a: nn.Module, b: nn.Module) -> bool:
    if isinstance(a, nn.Linear):
        return isinstance(b, nn.Linear)
    return type(a) is type(b) and a.groups == 1 and b.groups == 1  # type: ignore[union-attr]


def _constants(producer: nn.Module, between: list[nn.Module]) -> torch.Tensor:
    """What each output channel of ``producer`` becomes after ``between`` when its weights are zero."""
    bias = producer.bias if producer.bias is not None else torch.zeros(producer.weight.shape[0])
    x = bias.detach().clone()
    if isinstance(producer, _CONVS):
        spatial = (16,) * (producer.weight.dim() - 2)  # room for pooling windows; a constant stays constant
        x = x.view(1, -1, *(1,) * len(spatial)).expand(1, -1, *spatial).contiguous()
    else:
        x = x.view(1, -1)
    with torch.no_grad():
        for m in between:
            x = m(x)
    return x.reshape(1, bias.shape[0], -1)[0, :, 0]  # a flattened output is channel-major


def _padding_is_zero(conv: nn.Module) -> bool:
    pad = conv.padding  # type: ignore[union-attr]
    return pad != "same" and all(p == 0 for p in (pad if isinstance(pad, tuple) else (pad,)))


def _shrink_pair(
    producer: nn.Module, between: list[nn.Module], consumer: nn.Module, group: int = 1
) -> tuple[int, int]:
    """Remove ``producer``'s dead output channels and the matching consumer inputs (``group`` inputs per
    channel: the spatial positions when a Flatten sits between a conv and a Linear)."""
    w = producer.weight.detach()
    dead = w.reshape(w.shape[0], -1).abs().sum(1) == 0
    if not dead.any():
        return 0, int(w.shape[0])
    const = _constants(producer, between)
    if isinstance(consumer, _CONVS) and not _padding_is_zero(consumer):
        # zero padding makes a constant input contribute differently at the borders: remove only
        # channels that are exactly zero after the activations
        dead &= const == 0
    if dead.all():
        dead[0] = False  # keep one channel so every layer keeps a valid shape
    if not dead.any():
        return 0, int(w.shape[0])
    keep = ~dead
    dead_in, keep_in = dead.repeat_interleave(group), keep.repeat_interleave(group)
    const_in = const.repeat_interleave(group)
    with torch.no_grad():
        cw = consumer.weight
        # fold the constant outputs of the removed channels into the consumer's bias
        contrib = (cw[:, dead_in] * const_in[dead_in].view(1, -1, *(1,) * (cw.dim() - 2))).sum(
            dim=tuple(range(1, cw.dim()))
        )
        if consumer.bias is None:
            if contrib.abs().max() > 0:
                consumer.bias = nn.Parameter(contrib.clone())
        else:
            consumer.bias.add_(contrib)
        consumer.weight = nn.Parameter(cw[:, keep_in].clone())
        producer.weight = nn.Parameter(w[keep].clone())
        if producer.bias is not None:
            producer.bias = nn.Parameter(producer.bias[keep].clone())
        for m in between:
            if isinstance(m, _NORMS):
                if m.weight is not None:
                    m.weight = nn.Parameter(m.weight[keep].clone())
                    m.bias = nn.Parameter(m.bias[keep].clone())
                if m.running_mean is not None:
                    m.running_mean = m.running_mean[keep].clone()
                    m.running_var = m.running_var[keep].clone()
                m.num_features = int(keep.sum())
    n = int(keep.sum())
    if isinstance(producer, nn.Linear):
        producer.out_features = n  # type: ignore[union-attr]
    else:
        producer.out_channels = n  # type: ignore[union-attr]
    if isinstance(consumer, nn.Linear):
        consumer.in_features = n * group  # type: ignore[union-attr]
    else:
        consumer.in_channels = n  # type: ignore[union-attr]
    return int(dead.sum()), int(w.shape[0])


def _flatten_group(producer: nn.Module, between: list[nn.Module], consumer: nn.Module) -> int | None:
    """Inputs of ``consumer`` (a Linear) per output channel of ``producer`` (a conv) when ``between``
    holds one ``Flatten(1, -1)`` and only elementwise modules after it; None when that is not the case."""
    flats = [i for i, m in enumerate(between) if isinstance(m, nn.Flatten)]
    if len(flats) != 1 or not isinstance(consumer, nn.Linear) or not isinstance(producer, _CONVS):
        return None
    flat = between[flats[0]]
    if (flat.start_dim, flat.end_dim) != (1, -1):
        return None
    if any(isinstance(m, (*_POOLS, *_NORMS, *_ADAPTIVE)) for m in between[flats[0] + 1 :]):
        return None  # after flattening, only per-element modules keep the channel-major layout
    channels = producer.weight.shape[0]
    if consumer.in_features % channels:
        return None
    return consumer.in_features // channels


def remove_dead_channels(model: nn.Module) -> Shrunk:
    """Delete all-zero output channels that feed the next layer directly; in place, in eval mode.

    BatchNorm between the two layers uses its running statistics (eval mode), so call this on a model
    for inference, after training.
    """
    model.eval()
    removed = total = changed = 0
    # only plain Sequentials: a subclass with its own forward may use its children differently
    seqs = [
        m
        for m in model.modules()
        if isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward
    ]
    for seq in seqs:
        layers = list(seq)
        for i, producer in enumerate(layers):
            if not isinstance(producer, (nn.Linear, *_CONVS)):
                continue
            between: list[nn.Module] = []
            for nxt in layers[i + 1 :]:
                if _passes(nxt) or (isinstance(nxt, nn.Flatten) and isinstance(producer, _CONVS)):
                    between.append(nxt)
                    continue
                if any(isinstance(m, nn.Flatten) for m in between):
                    group = _flatten_group(producer, between, nxt)
                else:
                    group = 1 if _same_kind(producer, nxt) else None
                if group is not None:
                    r, t = _shrink_pair(producer, between, nxt, group)
                    removed, total, changed = removed + r, total + t, changed + (r > 0)
                break
    return Shrunk(removed, total, changed)
