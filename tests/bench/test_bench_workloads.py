import torch
import torchvision

from pitstop.bench.measure import flops_per_sample, matmul_peak, step_memory
from pitstop.bench.workloads import (
    GPT,
    MLP,
    WorkloadSpec,
    build_workload,
    image_side,
    make_image_folder,
    repeated_blocks,
)

torch.set_num_threads(1)


def test_repeated_blocks_finds_resnet_stages_and_transformer_layers():
    names = repeated_blocks(torchvision.models.resnet18())
    assert names == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    assert repeated_blocks(GPT(64, 8, 3, 16, 2)) == ["blocks.0", "blocks.1", "blocks.2"]
    assert repeated_blocks(MLP(4, 8, 2, 3)) == ["blocks.0", "blocks.1"]
    assert repeated_blocks(torch.nn.Linear(3, 3)) == []


def test_image_folder_is_real_jpegs(tmp_path):
    w = build_workload(WorkloadSpec("vision", "tiny", data_dir=str(tmp_path)))
    make_image_folder(tmp_path, 8, 4, image_side(w))
    assert len(list(tmp_path.glob("class_*/*.jpg"))) == 8
    x, y = w.example_batch()
    assert x.shape == (w.batch_size, 3, 32, 32) and y.shape == (w.batch_size,)
    assert make_image_folder(tmp_path, 8, 4, image_side(w)) == tmp_path  # idempotent


def test_flops_per_sample_matches_matmul_count():
    w = build_workload(WorkloadSpec("tabular", "tiny"))
    p = w.params  # features 32, hidden 64, blocks 2, classes 4
    f, h, c = p["features"], p["hidden"], p["classes"]
    fwd = 2 * (f * h + 2 * p["blocks"] * h * h + h * c)
    # backward: weight grads for every layer, input grads for all but the first (its input needs none)
    bwd = fwd + 2 * (2 * p["blocks"] * h * h + h * c)
    assert flops_per_sample(w) == fwd + bwd


def test_checkpointing_and_accumulation_cut_measured_activation_memory():
    from pitstop.bench.configs import BASELINE, BenchConfig
    from pitstop.bench.session import Session

    w = build_workload(WorkloadSpec("language", "tiny"))
    mem = {}
    for cfg in (
        BASELINE,
        BenchConfig("ck", "ck", checkpoint=True),
        BenchConfig("acc", "acc", accumulation=4),
    ):
        s = Session(w, cfg)
        s.step()
        mem[cfg.name] = step_memory(s.step)
    base = mem["baseline"].activation_bytes
    assert base and base > 0
    assert mem["ck"].activation_bytes < 0.7 * base
    assert mem["acc"].activation_bytes < 0.5 * base
    assert mem["baseline"].peak_bytes >= base


def test_matmul_peak_is_measured():
    p = matmul_peak("float32", sizes=(32, 64), min_run_time=0.02)
    assert p.flops_per_s > 0 and p.seconds > 0 and p.n in (32, 64)
    assert p.flops_per_s == 2 * p.n**3 / p.seconds
