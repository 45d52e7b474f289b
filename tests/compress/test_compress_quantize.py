import pytest
import torch
from torch import nn

from pitstop.compress import digits, measure
from pitstop.compress.quantization import NotApplicable, quantize, quantize_detailed


def test_dynamic_int8_shrinks_the_mlp_3x_and_keeps_accuracy(trained_mlp, test_loader):
    base_size = measure.serialized_size(trained_mlp).bytes
    base_acc = measure.accuracy(trained_mlp, test_loader).value
    q = quantize_detailed(trained_mlp, "dynamic_int8")
    size = measure.serialized_size(q.portable).bytes
    acc = measure.accuracy(q.model, test_loader).value
    assert base_size / size >= 3.0
    assert abs(base_acc - acc) <= 0.02
    assert q.quantized_layers == 3
    assert sum("quantized.dynamic" in type(m).__module__ for m in q.model.modules()) == 3
    assert isinstance(trained_mlp[1], nn.Linear)  # the input model is not modified


def test_dynamic_int8_does_not_apply_to_a_conv_only_net():
    with pytest.raises(NotApplicable, match="Linear/LSTM/GRU"):
        quantize(digits.conv_only(), "dynamic_int8")


def test_unknown_method_and_missing_calibration_are_clear_errors():
    m = digits.mlp()
    with pytest.raises(ValueError, match="unknown quantization method"):
        quantize(m, "int3")
    with pytest.raises(NotApplicable, match="calibration"):
        quantize(m, "static_int8")


@pytest.mark.slow
def test_static_int8_quantizes_the_cnn_to_onednn_int8_kernels(trained_cnn, test_loader):
    base_acc = measure.accuracy(trained_cnn, test_loader).value
    q = quantize_detailed(trained_cnn, "static_int8", digits.train_loader(), calib_batches=4)
    targets = {str(n.target) for n in q.model.graph.nodes if n.op == "call_function"}
    assert any("onednn.qconv" in t for t in targets)
    acc = measure.accuracy(q.model, test_loader).value
    assert abs(base_acc - acc) <= 0.02
    # the saved form holds int8 weights only: no fp32 weight left behind
    sd = q.portable.state_dict()
    assert not any(k.endswith(".weight") for k in sd)
    assert sum(v.dtype == torch.int8 for v in sd.values()) == 3
    assert measure.serialized_size(trained_cnn).bytes / measure.serialized_size(q.portable).bytes >= 2.0
    # the batch dimension stays dynamic: batch 1 and an odd batch run and agree with the float model
    x = next(iter(test_loader))[0]
    for n in (1, 7):
        out = q.model(x[:n])
        assert out.shape == (n, 10)
        assert (out.argmax(1) == trained_cnn(x[:n]).argmax(1)).float().mean() >= 0.8


class _Residual(nn.Module):
    """The torchvision ResNet pattern: one ReLU module called twice, and a residual add.

    ``stem=True``: the residual comes from a conv, as in ResNet; False: straight from the input."""

    def __init__(self, stem: bool):
        super().__init__()
        self.stem = nn.Conv2d(4, 4, 1) if stem else nn.Identity()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        x = self.stem(x)
        y = self.relu(self.conv1(x))
        y = self.relu(self.conv2(y) + x)
        return self.head(y.mean((2, 3)))


@pytest.mark.slow
@pytest.mark.parametrize("stem", [True, False])
def test_static_int8_handles_a_module_called_twice(stem):
    torch.manual_seed(0)
    m = _Residual(stem).eval()
    data = [(torch.randn(4, 4, 8, 8), torch.zeros(4, dtype=torch.long)) for _ in range(2)]
    q = quantize_detailed(m, "static_int8", calib_loader=data)
    x = data[0][0]
    with torch.no_grad():
        assert torch.allclose(q.model(x), m(x), atol=0.1)
    if stem:  # the ResNet shape lowers to oneDNN int8 kernels
        assert "oneDNN" in q.library and not q.notes
    else:  # a residual straight from the input: the fused add refuses it; the reference form runs
        assert "not lowered" in q.library and "lowering" in q.notes


class _Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 64, batch_first=True)
        self.head = nn.Linear(64, 5)

    def forward(self, x):
        return self.head(self.lstm(x)[0][:, -1])


def test_dynamic_int8_quantizes_lstm_layers_too():
    torch.manual_seed(0)
    m = _Tagger().eval()
    q = quantize_detailed(m, "dynamic_int8")
    assert q.quantized_layers == 2
    assert "quantized.dynamic" in type(q.model.lstm).__module__
    assert measure.serialized_size(m).bytes / measure.serialized_size(q.portable).bytes >= 3.0
    x = torch.randn(3, 7, 16)
    with torch.no_grad():
        assert torch.allclose(q.model(x), m(x), atol=0.05)


def test_dynamic_int8_falls_back_to_torchao_without_torch_ao(monkeypatch, trained_mlp, test_loader):
    import builtins

    real_import = builtins.__import__

    def no_torch_ao(name, globals=None, *args, **kwargs):
        # only pitstop's own import fails: torchao 0.18 itself still imports parts of torch.ao
        if (
            name == "torch.ao.quantization"
            and (globals or {}).get("__name__") == "pitstop.compress.quantization"
        ):
            raise ImportError("simulated removal")
        return real_import(name, globals, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch_ao)
    q = quantize_detailed(trained_mlp, "dynamic_int8")
    assert q.library == "torchao" and q.quantized_layers == 3
    assert measure.serialized_size(trained_mlp).bytes / measure.serialized_size(q.portable).bytes >= 3.0
    base = measure.accuracy(trained_mlp, test_loader).value
    assert abs(measure.accuracy(q.model, test_loader).value - base) <= 0.02
    with pytest.raises(NotApplicable, match="Linear only"):
        quantize(_Tagger().lstm, "dynamic_int8")


def test_missing_torchao_is_not_applicable(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a)
    )
    with pytest.raises(NotApplicable, match="torchao"):
        quantize(digits.mlp(), "int8_weight_only")
    with pytest.raises(NotApplicable, match="pitstop\\[compress\\]"):
        quantize(digits.cnn(), "static_int8", calib_loader=[(torch.randn(4, 1, 8, 8), None)])
