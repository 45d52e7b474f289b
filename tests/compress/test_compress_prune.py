import pytest
import torch
from torch import nn

from pitstop.compress import digits, measure, prune, prune_detailed

# The stated band: after 50% global magnitude pruning and a 100-step fine-tune, test accuracy stays
# within 2 points of the unpruned model (measured ~0 to +0.5 points on both digits models).
BAND = 0.02


@pytest.mark.parametrize("which", ["trained_mlp", "trained_cnn"])
def test_global_50_percent_gives_50_percent_zeros_and_accuracy_in_band(which, request, test_loader):
    model = request.getfixturevalue(which)
    base = measure.accuracy(model, test_loader).value
    p = prune_detailed(model, 0.5, finetune_loader=digits.train_loader(), finetune_steps=100)
    counted = measure.sparsity(p.model)
    assert counted.weights == pytest.approx(0.5, abs=1e-3)
    assert p.sparsity == counted
    assert p.finetune is not None and p.finetune.steps == 100
    assert measure.accuracy(p.model, test_loader).value >= base - BAND
    # permanent: plain parameters, no masks or hooks, the same state_dict keys as before
    assert set(p.model.state_dict()) == set(model.state_dict())
    assert not any(m._forward_pre_hooks for m in p.model.modules())
    assert measure.sparsity(model).weights < 0.01  # the input model is not modified


def test_fine_tune_keeps_pruned_weights_at_zero():
    torch.manual_seed(0)
    m = digits.mlp(hidden=32, depth=1)
    p = prune(m, 0.7, finetune_loader=digits.train_loader(), finetune_steps=20, lr=1e-2)
    assert measure.sparsity(p).weights == pytest.approx(0.7, abs=1e-3)


def test_structured_pruning_zeroes_whole_output_channels_but_not_the_output_layer():
    torch.manual_seed(0)
    m = digits.cnn()
    p = prune(m, 0.25, structured=True)
    convs = [mod for mod in p.modules() if isinstance(mod, nn.Conv2d)]
    for conv in convs:
        zero_rows = int((conv.weight.flatten(1).abs().sum(1) == 0).sum())
        assert zero_rows == round(0.25 * conv.out_channels)
    head = [mod for mod in p.modules() if isinstance(mod, nn.Linear)][-1]
    assert int((head.weight == 0).sum()) == 0


def test_bad_amount_is_rejected():
    with pytest.raises(ValueError, match="amount"):
        prune(nn.Linear(2, 2), 1.0)
    with pytest.raises(ValueError, match="no Linear/Conv"):
        prune(nn.Sequential(nn.ReLU()), 0.5)
