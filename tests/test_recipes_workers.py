"""recipes.workers: the one DataLoader worker count, on fabricated machines and measured curves."""

from __future__ import annotations

import pytest

from pitstop.recipes.workers import MAX_WORKERS, WorkerMachine, choose_workers, free_cores, worker_cap


@pytest.mark.parametrize(
    ("machine", "workers", "cap"),
    [
        (WorkerMachine(cores=1, torch_max=1), 1, 1),
        (WorkerMachine(cores=2, torch_max=2), 1, 2),  # one core stays with the training step
        (WorkerMachine(cores=8, torch_max=8), 7, 8),
        (WorkerMachine(cores=32, torch_max=32), MAX_WORKERS, MAX_WORKERS),
        (WorkerMachine(cores=8, torch_max=8, ranks=2), 3, 4),  # two ranks share the cores
        (WorkerMachine(cores=8, torch_max=8, ranks=16), 1, 1),
        (WorkerMachine(cores=4, torch_max=4, other_busy=2.4), 1, 2),  # others keep ~2 cores busy
        (WorkerMachine(cores=4, torch_max=4, other_busy=9.0), 1, 1),  # all busy: one core still left
        (WorkerMachine(cores=4, torch_max=4, other_busy=0.3), 3, 4),  # a sliver of load: no core lost
        (WorkerMachine(cores=8, torch_max=3), 3, 3),  # torch warns above 3: never more
    ],
)
def test_default_without_measurements(machine, workers, cap):
    choice = choose_workers(machine)
    assert (choice.workers, choice.cap, choice.measured) == (workers, cap, False)
    assert worker_cap(machine) == cap and 1 <= choice.workers <= free_cores(machine)


def test_the_measured_curve_picks_the_fewest_workers_within_min_gain_of_the_fastest():
    m = WorkerMachine(cores=4, torch_max=4)
    curve = {0: 10.0, 1: 20.0, 2: 20.3, 3: 25.0, 4: 25.5}
    choice = choose_workers(m, curve, min_gain=0.03)
    assert choice.workers == 3 and choice.measured  # 4 is only 2% faster than 3
    assert choose_workers(m, curve, min_gain=0.01).workers == 4


def test_a_faster_count_above_the_cap_is_reported_not_chosen():
    m = WorkerMachine(cores=2, torch_max=2)
    choice = choose_workers(m, {0: 5.0, 1: 10.0, 2: 12.0, 4: 20.0, 8: 21.0})
    assert choice.workers == 2 and choice.faster_above_cap == 4 and "exceeds the cap" in choice.basis


def test_a_curve_measured_only_above_the_cap_gives_the_default():
    m = WorkerMachine(cores=2, torch_max=2)
    assert choose_workers(m, {6: 30.0, 8: 31.0}).workers == choose_workers(m).workers == 1


def test_of_run_reads_the_runs_load_and_ranks(monkeypatch):
    monkeypatch.setattr("pitstop.recipes.workers.usable_cores", lambda: 8)
    monkeypatch.setattr("pitstop.recipes.workers.affinity_cpus", lambda: 8)
    m = WorkerMachine.of_run({"other_cpu_share": 0.5, "distributed": {"local_world_size": 2}})
    assert (m.cores, m.ranks, m.other_busy) == (8, 2, pytest.approx(4.0))
    assert choose_workers(m).workers == 1  # 4 free cores, 2 ranks: 2 each, one of them for training
    assert WorkerMachine.of_run(None, cores=3).cores == 3
