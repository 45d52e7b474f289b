"""The `pitstop tune ...` and `pitstop fix` command lines: factory mode in-process, script mode through the
profile runner (slow), usage errors without tracebacks."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

import pytest

from pitstop.fix.cli import register as register_fix
from pitstop.tune.cli import register as register_tune


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`pitstop tune` and `pitstop fix`, as the CLI registers them (each from its own package)."""
    register_tune(sub)
    register_fix(sub)


FACTORY = textwrap.dedent(
    """
    import time
    import torch
    from torch.utils.data import Dataset, TensorDataset

    class Slow(Dataset):
        def __len__(self):
            return 100000

        def __getitem__(self, i):
            time.sleep(0.01)
            return torch.full((8,), float(i % 7)), i % 3

    def make_dataset():
        return Slow()

    def make_digits():
        from sklearn.datasets import load_digits
        x, y = load_digits(return_X_y=True)
        return TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    """
)

SCRIPT = textwrap.dedent(
    """
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 100000

        def __getitem__(self, i):
            time.sleep(0.01)
            return torch.full((8,), float(i % 7)), i % 3

    torch.manual_seed(0)
    loader = DataLoader(Slow(), batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 50:
            break
    """
)


def validate_report(d: dict) -> None:
    import jsonschema

    from pitstop.report.jsonfmt import load_schema

    jsonschema.validate(d, load_schema())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pitstop")
    register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(argv)
    return ns.func(ns)


@pytest.fixture
def factory(tmp_path):
    p = tmp_path / "factories.py"
    p.write_text(FACTORY)
    return p


def test_registers_tune_and_fix():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    register(sub)
    assert {"tune", "fix"} <= set(sub.choices)


@pytest.mark.slow
def test_tune_loader_factory_mode_writes_json_html_and_plot(factory, tmp_path, capsys):
    out, html, png = tmp_path / "r.json", tmp_path / "r.html", tmp_path / "curve.png"
    code = main(
        [
            "tune", "loader", "--dataset", f"{factory}:make_dataset", "--batch-size", "4",
            "--max-workers", "2", "--time-per-point", "0.4", "--repeats", "2",
            "--prefetch", "2", "--confirm-rounds", "1", "--json", str(out), "--html", str(html), "--plot", str(png),
        ]
    )  # fmt: skip
    assert code == 0
    d = json.loads(out.read_text())
    validate_report(d)
    assert d["tool"] == "tune loader"
    best = next(f for f in d["findings"] if f["id"] == "tune.loader.best")
    assert best["data"]["chosen"].startswith("workers=2")
    assert d["sections"]["loader_tune"]["speedup"] > 1.2
    assert "Measured DataLoader settings" in html.read_text()
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "Measured DataLoader settings" in capsys.readouterr().out


def test_tune_lr_and_batch_size_factory_mode(factory, tmp_path):
    out = tmp_path / "lr.json"
    code = main(
        [
            "tune", "lr", "--model", f"{factory}:make_model", "--dataset", f"{factory}:make_digits",
            "--steps", "40", "--start-lr", "1e-4", "--end-lr", "10", "--json", str(out), "-q",
        ]
    )  # fmt: skip
    assert code == 0
    d = json.loads(out.read_text())
    validate_report(d)
    f = next(f for f in d["findings"] if f["id"] == "tune.lr.suggestion")
    assert f["data"]["suggested_max_lr"] > 0
    out2 = tmp_path / "bs.json"
    code = main(
        [
            "tune", "batch-size", "--model", f"{factory}:make_model", "--dataset", f"{factory}:make_digits",
            "--budget-mib", "64", "--max", "64", "--json", str(out2), "-q",
        ]
    )  # fmt: skip
    assert code == 0
    d = json.loads(out2.read_text())
    validate_report(d)
    f = next(f for f in d["findings"] if f["id"] == "tune.batch_size.best")
    assert f["data"]["best"] == 64  # a tiny model: the cap is reached inside a 64 MiB budget


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tune", "loader"], "either --dataset"),
        (["tune", "loader", "--dataset", "nosuchmod:make"], "cannot load the dataset"),
        (["tune", "loader", "--dataset", "x:y", "--time-per-point", "0"], "must be positive"),
        (["tune", "lr", "--start-lr", "1", "--end-lr", "0.1"], "start-lr"),
        (["tune", "batch-size"], "--model and --dataset"),
        (["fix"], "after --"),
        (["fix", "--candidates", "turbo", "--", "python", "x.py"], "unknown candidate"),
    ],
)
def test_usage_errors_exit_2_with_a_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_tune_loader_script_mode_captures_the_scripts_loader(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "r.json"
    code = main(
        [
            "tune", "loader", "--max-workers", "2", "--time-per-point", "0.4", "--repeats", "2",
            "--prefetch", "2", "--confirm-rounds", "1", "--json", str(out), "-q", "--", sys.executable, str(script),
        ]
    )  # fmt: skip
    assert code == 0
    d = json.loads(out.read_text())
    assert d["error"] is None
    best = next(f for f in d["findings"] if f["id"] == "tune.loader.best")
    assert best["location"].endswith("train.py:15")  # the script's own DataLoader(...) line
    assert best["data"]["baseline"] == "workers=0 bs=4"
    assert best["data"]["speedup"] > 1.2


@pytest.mark.slow
def test_tune_lr_script_mode_uses_the_scripts_model_and_optimizer(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("time.sleep(0.01)", "pass"))
    out = tmp_path / "r.json"
    code = main(["tune", "lr", "--steps", "30", "--json", str(out), "-q", "--", sys.executable, str(script)])
    assert code == 0
    d = json.loads(out.read_text())
    assert d["error"] is None
    assert len(d["sections"]["lr_range"]["lrs"]) > 3


def test_script_mode_reports_a_script_that_fails(tmp_path, capsys):
    script = tmp_path / "broken.py"
    script.write_text("raise SystemExit('no data directory')\n")
    out = tmp_path / "r.json"
    code = main(["tune", "loader", "--json", str(out), "-q", "--", sys.executable, str(script)])
    assert code == 1
    d = json.loads(out.read_text())
    assert d["findings"][0]["id"] == "tune.script" and d["error"]


def test_batches_of_any_size_from_the_scripts_last_batch():
    import torch

    from pitstop.tune.script import batch_from_last

    make = batch_from_last((torch.arange(6).reshape(3, 2), torch.tensor([0, 1, 2]), "meta"))
    x, y, tag = make(7)
    assert x.shape == (7, 2) and y.tolist() == [0, 1, 2, 0, 1, 2, 0] and tag == "meta"
    d = batch_from_last({"input_ids": torch.ones(2, 5, dtype=torch.long)})(3)
    assert d["input_ids"].shape == (3, 5)
