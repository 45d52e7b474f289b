import os

import pytest
import torch
from torch import nn

from pitstop.compress import measure


def test_serialized_size_is_the_saved_file_size(tmp_path):
    m = nn.Linear(100, 50)
    path = tmp_path / "model.pt"
    torch.save(m.state_dict(), path)
    size = measure.serialized_size(m)
    assert size.bytes == os.path.getsize(path)
    assert 0 < size.gzip_bytes <= size.bytes * 1.01


def test_param_count_matches_parameters_for_a_float_model():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8, 4))
    assert measure.param_count(m) == sum(p.numel() for p in m.parameters())  # running stats not counted


def test_sparsity_counts_exact_zeros():
    m = nn.Sequential(nn.Linear(4, 5, bias=False), nn.Linear(5, 2))
    with torch.no_grad():
        m[0].weight.fill_(1.0)
        m[0].weight[:2] = 0.0  # 8 of 20
        m[1].weight.fill_(1.0)
        m[1].bias.zero_()  # 2 zeros in a bias: a parameter, not a prunable weight
    sp = measure.sparsity(m)
    assert (sp.weight_zeros, sp.weight_total) == (8, 30)
    assert (sp.param_zeros, sp.param_total) == (10, 32)
    assert sp.weights == pytest.approx(8 / 30)


class _Oracle(nn.Module):
    """Returns logits whose argmax is the label stored in the input's first column."""

    def forward(self, x):
        return nn.functional.one_hot(x[:, 0].long(), 3).float()


def test_accuracy_counts_correct_predictions():
    labels = torch.tensor([0, 1, 2, 1, 0, 2])
    x = torch.stack([labels.float(), torch.zeros(6)], 1)
    y = labels.clone()
    y[:2] = (y[:2] + 1) % 3  # two wrong
    batches = [(x[:4], y[:4]), (x[4:], y[4:])]
    acc = measure.accuracy(_Oracle(), batches)
    assert acc.samples == 6
    assert acc.value == pytest.approx(4 / 6)
    assert measure.accuracy(_Oracle(), batches, max_batches=1).samples == 4


def test_accuracy_is_not_measured_for_regression_outputs():
    m = nn.Linear(3, 1)
    acc = measure.accuracy(m, [(torch.randn(4, 3), torch.randn(4, 1))])
    assert acc.value is None and "logits" in acc.reason
    assert measure.accuracy(m, [torch.randn(4, 3)]).value is None


def test_latency_measures_each_model_at_the_given_batch():
    a, b = nn.Linear(16, 16), nn.Linear(16, 4)
    x = torch.randn(8, 16)
    one = measure.latency(a, x[:1], threads=1, min_run_time=0.02)
    assert one.batch == 1 and one.median_s > 0 and one.runs >= 1
    both = measure.interleaved_latency({"a": a, "b": b}, x, rounds=2, threads=1, min_run_time=0.02)
    assert set(both) == {"a", "b"}
    assert all(v.batch == 8 and v.median_s > 0 and v.runs >= 2 for v in both.values())
    assert a.training  # measuring leaves the mode as it was
    # the engine's rounds: the first model is the baseline, the others carry their interval over it
    assert both["a"].interval is None
    assert both["b"].interval is not None and both["b"].interval.rounds == 2


def test_latency_verdict_comes_from_the_engines_interval():
    from pitstop.compress.report import Row
    from pitstop.compress.report_findings import _engine_verdicts
    from pitstop.measure import Interval

    r = Row("int8")
    assert _engine_verdicts(r) == []
    r.extra["latency_interval"] = {
        "batch_1": Interval(1.5, 1.3, 1.7, 3, 30, 30).to_dict(),
        "batch_n": Interval(1.02, 0.9, 1.2, 3, 30, 30).to_dict(),
    }
    assert _engine_verdicts(r) == ["helped", "undecided"]
