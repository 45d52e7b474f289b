"""Launch for real here: the child's affinity and thread settings, several instances, torchrun + gloo."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from pitstop.launch.cli import register

# The launch area's commands alone (the full `pitstop` CLI needs every area's module).
CLI = (
    "import argparse, sys\n"
    "from pitstop.launch.cli import register\n"
    "p = argparse.ArgumentParser(prog='pitstop')\n"
    "register(p.add_subparsers(dest='command', required=True))\n"
    "ns = p.parse_args(sys.argv[1:])\n"
    "sys.exit(ns.func(ns))\n"
)


def main(argv):
    parser = argparse.ArgumentParser(prog="pitstop")
    register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(argv)
    return ns.func(ns)


ALLOWED = sorted(os.sched_getaffinity(0))

PROBE = textwrap.dedent(
    """
    import json, os, sys
    out = sys.argv[1]
    i = os.environ.get("PITSTOP_INSTANCE", "0")
    with open(os.path.join(out, f"probe{i}.json"), "w") as fh:
        json.dump({"cpus": sorted(os.sched_getaffinity(0)), "omp": os.environ.get("OMP_NUM_THREADS"),
                   "gomp": os.environ.get("GOMP_CPU_AFFINITY"), "args": sys.argv[2:]}, fh)
    """
)


def _probe(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


def _read(tmp_path, i=0):
    return json.loads((tmp_path / f"probe{i}.json").read_text())


@pytest.mark.parametrize("bind", ["affinity", "taskset"])
def test_binding_is_applied_to_the_child(tmp_path, bind):
    if bind == "taskset" and not shutil.which("taskset"):
        pytest.skip("taskset not installed")
    cpu = ALLOWED[0]
    rc = main(
        ["launch", "--bind", bind, "--core-list", str(cpu), "--", str(_probe(tmp_path)), str(tmp_path), "x"]
    )
    assert rc == 0
    got = _read(tmp_path)
    assert got == {"cpus": [cpu], "omp": "1", "gomp": str(cpu), "args": ["x"]}


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 CPUs")
def test_two_instances_get_disjoint_cores(tmp_path):
    rc = main(
        [
            "launch",
            "--bind",
            "affinity",
            "--ninstances",
            "2",
            "--use-logical-cores",
            "--core-list",
            f"{ALLOWED[0]},{ALLOWED[1]}",
            "--log-dir",
            str(tmp_path / "logs"),
            "--",
            str(_probe(tmp_path)),
            str(tmp_path),
        ]
    )
    assert rc == 0
    assert [_read(tmp_path, i)["cpus"] for i in (0, 1)] == [[ALLOWED[0]], [ALLOWED[1]]]
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["instance_0.log", "instance_1.log"]


def test_exit_code_is_passed_through(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit(3)\n")
    assert main(["launch", "--bind", "affinity", "--", str(script)]) == 3


def _cli(*args):
    return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=120)


def test_cli_dry_run_and_errors():
    r = _cli(
        "launch", "--dry-run", "--bind", "affinity", "--core-list", str(ALLOWED[0]), "--", "train.py", "--x"
    )
    assert r.returncode == 0, r.stderr
    assert f"OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 GOMP_CPU_AFFINITY={ALLOWED[0]}" in r.stdout
    assert "train.py --x" in r.stdout
    for args, msg in [
        (["--core-list", "4096"], "not online"),
        (["--ninstances", "4096"], "instances but only"),
        (["--bind", "numactl"] if not shutil.which("numactl") else ["--allocator", "jemalloc"], "install"),
        ([], "no command given"),
    ]:
        r = _cli("launch", "--dry-run", *args, *(["--", "t.py"] if args else []))
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert msg in r.stderr.replace("\n", " ") and "Traceback" not in r.stderr


DDP = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    r = dist.get_rank()
    t = torch.tensor([float(r + 1)])
    dist.all_reduce(t)
    with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as fh:
        json.dump({"rank": r, "world": dist.get_world_size(), "sum": t.item(), "local": os.environ["LOCAL_RANK"],
                   "cpus": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}, fh)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 CPUs")
def test_torchrun_starts_two_gloo_ranks_bound_to_their_cores(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    r = _cli(
        "launch",
        "--nproc-per-node",
        "2",
        "--use-logical-cores",
        "--core-list",
        f"{ALLOWED[0]},{ALLOWED[1]}",
        "--",
        str(script),
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1)]
    assert [(d["rank"], d["world"], d["sum"]) for d in ranks] == [(0, 2, 3.0), (1, 2, 3.0)]
    by_local = {d["local"]: d for d in ranks}
    assert by_local["0"]["cpus"] == [ALLOWED[0]] and by_local["1"]["cpus"] == [ALLOWED[1]]
    assert {d["threads"] for d in ranks} == {1}
    assert "pitstop.launch.bootstrap" in r.stderr  # the exact command was printed


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 CPUs")
@pytest.mark.parametrize("as_module", [False, True])
def test_bootstrap_binds_the_local_rank_then_runs_the_target(tmp_path, as_module):
    _probe(tmp_path)
    env = {
        **os.environ,
        "LOCAL_RANK": "1",
        "PITSTOP_RANK_CPUS": f"{ALLOWED[0]};{ALLOWED[1]}",
        "PITSTOP_BIND": "1",
    }
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    target = ["-m", "probe"] if as_module else [str(tmp_path / "probe.py")]
    r = subprocess.run(
        [sys.executable, "-m", "pitstop.launch.bootstrap", *target, str(tmp_path), "a", "b"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert _read(tmp_path) == {"cpus": [ALLOWED[1]], "omp": "1", "gomp": str(ALLOWED[1]), "args": ["a", "b"]}


def test_bootstrap_without_a_slot_leaves_affinity_alone(tmp_path):
    _probe(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PITSTOP_RANK_CPUS"}
    r = subprocess.run(
        [sys.executable, "-m", "pitstop.launch.bootstrap", str(tmp_path / "probe.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert _read(tmp_path)["cpus"] == ALLOWED
