"""Knobs: the one record of the optimization settings that Overrides, BenchConfig and TrainConfig share."""

import dataclasses

import pytest

from pitstop.bench.configs import BASELINE, BenchConfig, ablation
from pitstop.profile.record.overrides import Overrides
from pitstop.recipes import RECIPES, enabled, recipe
from pitstop.recipes.knobs import DATALOADER_KEYS, Knobs, knob_fields, knobs_of


def test_overrides_and_bench_rows_declare_no_knob_of_their_own():
    own = {f.name for f in dataclasses.fields(Overrides)} - knob_fields()
    assert own == {"ddp_no_sync", "ddp_static_graph"}
    assert knob_fields() <= {f.name for f in dataclasses.fields(BenchConfig)}
    assert issubclass(Overrides, Knobs) and issubclass(BenchConfig, Knobs)


def test_every_recipe_knob_is_a_knobs_field_or_a_dataloader_keyword():
    for r in RECIPES:
        if not r.override:
            continue
        head, _, key = r.override.partition(".")
        if head == "dataloader":
            assert key in DATALOADER_KEYS
        elif head not in {"ddp_no_sync", "ddp_static_graph"}:
            assert head in knob_fields(), r.name


def test_setting_by_recipe_name_and_validation():
    assert Knobs.setting(recipe("compile").override, True) == Knobs(compile=True)
    assert Overrides.setting("dataloader.pin_memory", True).pin_memory is True
    assert Knobs(dataloader={"num_workers": 3}).num_workers == 3
    with pytest.raises(ValueError, match="autocast"):
        Knobs(autocast="float64")
    with pytest.raises(ValueError, match="DataLoader"):
        Knobs(dataloader={"shuffle": True})
    with pytest.raises(ValueError, match="no field"):
        Knobs.setting("nope", True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Knobs().compile = True  # type: ignore[misc]


def test_overrides_json_round_trip_keeps_its_keys():
    ov = Overrides(dataloader={"num_workers": 2}, channels_last=True, ddp_no_sync=4)
    d = ov.to_dict()
    assert d["dataloader"] == {"num_workers": 2} and d["channels_last"] is True and d["ddp_no_sync"] == 4
    assert Overrides.from_dict({**d, "unknown": 1}) == ov
    assert ov.describe() == "num_workers=2, channels_last=True, ddp_no_sync=4"
    assert knobs_of(ov) == Knobs(dataloader={"num_workers": 2}, channels_last=True)


def test_bench_rows_set_knobs_and_enable_components():
    rows = {c.name: c for c in ablation("cuda", True, "bfloat16")}
    assert rows["channels_last"].knobs() == "channels_last"
    assert [c.NAME for c in enabled(rows["channels_last"])] == ["channels_last"]
    assert enabled(BASELINE) == []
    assert rows["all"].knobs() == "num_workers=2, pin_memory, channels_last, autocast bfloat16, fused AdamW"
    assert rows["fused"].fused and rows["amp_bf16"].amp == "bfloat16"
    from pitstop.bench.worker import config_from_dict

    assert config_from_dict(rows["all"].to_dict()) == rows["all"]


def test_train_config_resolves_its_auto_settings_to_knobs():
    torch = pytest.importorskip("torch")
    from pitstop.train import TrainConfig

    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    k = TrainConfig(precision="fp32").knobs("cpu", conv)
    assert k.channels_last and k.keep_host_memory and k.autocast is None and not k.cudnn_benchmark
    assert not TrainConfig(channels_last=False).knobs("cpu", conv).channels_last
    assert not TrainConfig(precision="fp32").knobs("cpu", torch.nn.Linear(2, 2)).channels_last
    assert TrainConfig(precision="bf16", compile=True).knobs("cpu").autocast == "bfloat16"
