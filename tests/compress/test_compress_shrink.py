import torch
from torch import nn

from pitstop.compress import digits, measure, prune
from pitstop.compress.shrink import remove_dead_channels


def _randomize_bn(model):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
            nn.init.normal_(m.weight)
            nn.init.normal_(m.bias)


def test_removing_dead_linear_channels_keeps_the_function_exactly():
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 96), nn.BatchNorm1d(96), nn.GELU(),
        nn.Linear(96, 10),
    )  # fmt: skip
    _randomize_bn(m)
    p = prune(m.eval(), 0.4, structured=True)
    x = torch.randn(7, 64)
    ref = p(x)
    s = remove_dead_channels(p)
    assert s.channels_removed == round(0.4 * 128) + round(0.4 * 96)
    assert (p[0].out_features, p[3].in_features, p[4].num_features) == (77, 77, 58)
    assert torch.allclose(p(x), ref, atol=1e-5)
    assert measure.param_count(p) < 0.6 * measure.param_count(m)


def test_conv_channels_fold_when_exact_and_stay_when_padding_would_change_borders():
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3),  # no padding: a constant channel contributes a constant
        nn.ReLU(),
        nn.Conv2d(32, 8, 3, padding=1),  # padding: only channels that are exactly 0 after ReLU can go
        nn.Tanh(),
        nn.Conv2d(8, 4, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    ).eval()  # fmt: skip
    _randomize_bn(m)
    with torch.no_grad():
        m[4].bias[:16] = -1.0  # these become 0 after ReLU: removable despite the next conv's padding
        m[4].bias[16:] = 1.0  # these stay constant non-zero: must be kept
    p = prune(m, 0.5, structured=True)
    x = torch.randn(2, 3, 16, 16)
    ref = p(x)
    dead_conv2 = int((p[4].weight.flatten(1).abs().sum(1) == 0).sum())
    removable = int((p[4].weight.flatten(1).abs().sum(1)[:16] == 0).sum())
    s = remove_dead_channels(p)
    assert p[0].out_channels == 8 and p[4].in_channels == 8  # first pair: all 8 dead channels folded
    assert p[4].out_channels == 32 - removable and removable < dead_conv2
    assert s.channels_removed == 8 + removable + 4  # and the 4 dead of the third conv (next is 1x1, no pad)
    assert torch.allclose(p(x), ref, atol=1e-5)


def test_nothing_changes_without_dead_channels_or_in_custom_sequentials():
    class Custom(nn.Sequential):
        def forward(self, x):  # uses its children out of order: must not be touched
            return self[2](self[1](self[0](x))) + self[0](x).sum()

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert remove_dead_channels(plain).channels_removed == 0
    custom = Custom(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():
        custom[0].weight[:4] = 0
    assert remove_dead_channels(custom).channels_removed == 0
    padded = nn.Sequential(nn.Conv2d(1, 4, 1), nn.AvgPool2d(3, padding=1), nn.Conv2d(4, 2, 1))
    with torch.no_grad():
        padded[0].weight[:2] = 0
    assert remove_dead_channels(padded).channels_removed == 0
    # after a Flatten a BatchNorm1d normalizes features, not channels: the pair is left alone
    flat_bn = nn.Sequential(nn.Conv2d(1, 4, 1), nn.Flatten(), nn.BatchNorm1d(16), nn.Linear(16, 2)).eval()
    with torch.no_grad():
        flat_bn[0].weight[:2] = 0
    assert remove_dead_channels(flat_bn).channels_removed == 0


def test_structured_pruning_with_removal_shrinks_the_saved_model(trained_mlp, test_loader):
    model = trained_mlp
    dense = prune(model, 0.3, structured=True)
    small = prune(model, 0.3, structured=True, remove_channels=True)
    x = next(iter(test_loader))[0]
    assert torch.allclose(small(x), dense(x), atol=1e-4)
    ratio = measure.serialized_size(dense).bytes / measure.serialized_size(small).bytes
    assert ratio > 1.6  # 256->179 hidden units twice: (1 - 0.3)^2 of the middle layer
    assert digits.mlp()[1].in_features == 64  # the factory's model is untouched


def test_conv_channels_fold_through_flatten_into_a_linear_head(trained_cnn, test_loader):
    dense = prune(trained_cnn, 0.3, structured=True)
    small = prune(trained_cnn, 0.3, structured=True, remove_channels=True)
    convs = [m for m in small.modules() if isinstance(m, nn.Conv2d)]
    head = [m for m in small.modules() if isinstance(m, nn.Linear)][-1]
    assert convs[1].out_channels == 32 - round(0.3 * 32)
    assert head.in_features == convs[1].out_channels * 4  # AdaptiveAvgPool2d(2): 4 features per channel
    x = next(iter(test_loader))[0]
    assert torch.allclose(small(x), dense(x), atol=1e-4)
    assert measure.param_count(small) < 0.7 * measure.param_count(trained_cnn)
