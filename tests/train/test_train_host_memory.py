"""keep_host_memory: glibc thresholds raised once, never over a user's own allocator choice, and the
page faults of a repeated large allocation actually go away."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from pitstop.recipes.host_memory import (
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    TRIM_THRESHOLD,
    keep_host_memory,
)
from pitstop.train import TrainConfig, fit


class FakeLibc:
    def __init__(self, refuse: set[tuple[int, int]] | None = None, refuse_all: bool = False) -> None:
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse or set()
        self.refuse_all = refuse_all

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 0 if self.refuse_all or (param, value) in self.refuse else 1


def _keep(libc: FakeLibc, env: dict[str, str] | None = None, maps: str = "", platform: str = "linux"):
    return keep_host_memory(libc=libc, env=env or {}, maps=maps, platform=platform)  # type: ignore[arg-type]


def test_raises_both_thresholds() -> None:
    libc = FakeLibc()
    res = _keep(libc)
    assert res.applied and res.mmap_threshold == 1 << 30
    assert libc.calls == [(M_MMAP_THRESHOLD, 1 << 30), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)]
    assert "1024 MiB" in str(res)


def test_older_glibc_gets_its_32_mib_ceiling() -> None:
    libc = FakeLibc(refuse={(M_MMAP_THRESHOLD, 1 << 30)})
    res = _keep(libc)
    assert res.applied and res.mmap_threshold == 32 << 20
    assert (M_MMAP_THRESHOLD, 32 << 20) in libc.calls


def test_refusal_is_reported_not_raised() -> None:
    res = _keep(FakeLibc(refuse_all=True))
    assert not res.applied and "refused" in str(res)


@pytest.mark.parametrize(
    ("env", "maps", "platform", "why"),
    [
        ({}, "7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "linux", "jemalloc"),
        ({}, "7f00-7f01 r-xp 0 08:01 1 /opt/lib/libtcmalloc_minimal.so.4", "linux", "tcmalloc"),
        ({"MALLOC_MMAP_THRESHOLD_": "131072"}, "", "linux", "MALLOC_MMAP_THRESHOLD_"),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, "", "linux", "GLIBC_TUNABLES"),
        ({}, "", "darwin", "Linux-only"),
    ],
)
def test_leaves_a_users_own_choice_alone(env: dict[str, str], maps: str, platform: str, why: str) -> None:
    libc = FakeLibc()
    res = _keep(libc, env, maps, platform)
    assert not res.applied and why in str(res)
    assert libc.calls == []


_PROBE = textwrap.dedent(
    """
    import ctypes, json, resource, sys
    from pitstop.recipes.host_memory import keep_host_memory
    applied = keep_host_memory().applied if sys.argv[1] == "keep" else False
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    size = 64 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):  # one training step's big activation, allocated, written and freed, ten times
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        libc.free(p)
    print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
    """
)


def _faults(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc on Linux")
def test_repeated_large_allocations_stop_faulting() -> None:
    plain, kept = _faults("plain"), _faults("keep")
    if not kept["applied"]:
        pytest.skip("this C library does not take mallopt (not glibc)")
    pages = (64 << 20) // 4096
    assert plain["faults"] >= 5 * pages  # glibc mmaps and munmaps the block every time
    assert kept["faults"] < 2 * pages  # faulted in once, then reused


def test_fit_reports_it_and_can_be_turned_off() -> None:
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    loss = torch.nn.functional.cross_entropy
    res = fit(torch.nn.Linear(4, 2), None, loader, loss, TrainConfig(progress=False))
    assert res.applied["host_memory"] == str(keep_host_memory())  # auto on CPU, applied once per process
    off = fit(torch.nn.Linear(4, 2), None, loader, loss, TrainConfig(progress=False, keep_host_memory=False))
    assert off.applied["host_memory"] == "off"


_STEPS = textwrap.dedent(
    """
    import json, resource, torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1),
                            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
    opt = torch.optim.AdamW(m.parameters())
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x.clone()), y).backward()
        opt.step()
    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step()
    print(json.dumps({"faults_per_step": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10}))
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc on Linux")
def test_glibc_env_of_launch_stops_a_training_step_from_faulting() -> None:
    """`pitstop launch --allocator glibc` (and `auto` without jemalloc/tcmalloc) sets GLIBC_ENV for the child."""
    from pitstop.recipes.host_memory import GLIBC_ENV

    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}

    def faults(env: dict) -> float:
        out = subprocess.run(
            [sys.executable, "-c", _STEPS], capture_output=True, text=True, env=env, timeout=300, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])["faults_per_step"]

    plain, tuned = faults(base), faults({**base, **GLIBC_ENV})
    if plain < 100:
        pytest.skip(f"this malloc does not give the step's memory back ({plain:.0f} faults per step)")
    assert tuned < plain / 4, (plain, tuned)
