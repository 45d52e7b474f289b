"""`pitstop tune loader|batch-size|lr`: argument parsing; the work is in the modules (``pitstop fix`` has
its own, ``pitstop.fix.cli``).

Two ways to say what to tune: an importable factory (``--dataset pkg.mod:make_dataset``, ``--model ...``),
measured in this process; or the user's script after ``--``, run by the profile runner with a callback
that tunes the DataLoader/model/optimizer the script built, inside its own process.
"""

from __future__ import annotations

import argparse
from typing import Any

from pitstop.cliopts import add_options
from pitstop.cliutil import (
    add_output_args,
    comma_list,
    command_after_dashes,
    print_table,
    status,
)
from pitstop.factory import load_dataset, load_loss, load_model, optimizer_from_spec
from pitstop.tune.cli_options import BatchSizeArgs, LoaderArgs, LRArgs
from pitstop.units import MiB


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    tune = sub.add_parser(
        "tune",
        help="measure the fastest DataLoader settings, the largest batch size, an LR range",
        description="Measure settings on your data and model. Subcommands: loader, batch-size, lr.",
    )
    tsub = tune.add_subparsers(dest="tune_command", required=True, metavar="WHAT")
    _register_loader(tsub)
    _register_batch_size(tsub)
    _register_lr(tsub)


def _save_plot(path: str, *args: Any, **kwargs: Any) -> None:
    """Write a PNG; a bad path is a message, not a traceback (the report is still written)."""
    from rich.console import Console

    from pitstop.tune.plot import save_line_png

    try:
        save_line_png(path, *args, **kwargs)
        Console(stderr=True).print(f"plot: {path}")
    except (OSError, ValueError, ImportError) as e:  # ImportError: pitstop.plotting.PlotUnavailable
        Console(stderr=True).print(f"pitstop: could not write the plot {path}: {e}")


# ------------------------------------------------------------------------------------------ tune loader


def _register_loader(tsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = tsub.add_parser(
        "loader",
        help="find the fastest DataLoader settings for your dataset by measuring them",
        description=(
            "Sweep num_workers (pruned: stops climbing when throughput stops rising), prefetch_factor, "
            "persistent_workers and pin_memory (CUDA only) on your dataset, and report the fastest setting "
            "with its measured speed-up. Examples: pitstop tune loader --dataset mypkg.data:make_dataset "
            "--batch-size 64   |   pitstop tune loader -- python train.py --epochs 1"
        ),
    )
    add_options(p, LoaderArgs)
    add_output_args(p)
    p.set_defaults(func=cmd_tune_loader)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in comma_list(text))
    except ValueError as e:
        raise ValueError(f"{what}: expected comma-separated integers, got {text!r}") from e
    if any(v <= 0 for v in vals):
        raise ValueError(f"{what}: values must be positive, got {text!r}")
    return vals


def loader_config(args: argparse.Namespace) -> Any:
    from pitstop.tune.loader import TuneConfig
    from pitstop.tune.loader_measure import MeasureConfig

    if args.time_per_point <= 0 or args.repeats <= 0:
        raise ValueError("--time-per-point and --repeats must be positive")
    if args.max_workers is not None and args.max_workers < 0:
        raise ValueError("--max-workers must be >= 0")
    return TuneConfig(
        max_workers=args.max_workers,
        prefetch_factors=_ints(args.prefetch, "--prefetch"),
        batch_sizes=_ints(args.batch_sizes, "--batch-sizes"),
        measure=MeasureConfig(time_per_point=args.time_per_point, repeats=args.repeats),
        confirm_rounds=max(0, args.confirm_rounds),
    )


def cmd_tune_loader(args: argparse.Namespace) -> int:
    from pitstop.cliutil import finish, usage_error

    cmd = command_after_dashes(args)
    if bool(cmd) == bool(args.dataset):
        return usage_error("give either --dataset pkg.mod:make_dataset or a script after --")
    try:
        cfg = loader_config(args)
    except ValueError as e:
        return usage_error(str(e))
    from pitstop.tune.loader import LoaderTuneResult, tune_loader
    from pitstop.tune.reports import loader_report

    meta: dict[str, Any] = {}
    if args.dataset:
        try:
            dataset, base = load_dataset(args.dataset)
        except Exception as e:
            return usage_error(f"cannot load the dataset {args.dataset}: {e}")
        if not base:
            base = {"batch_size": args.batch_size, "num_workers": args.num_workers}
        meta["dataset"] = args.dataset
        with status("pitstop tune loader", not args.quiet) as update:
            result = tune_loader(dataset, base, cfg, progress=update)
    else:
        payload = _in_script(args, cmd, "loader", meta, cfg)
        if isinstance(payload, int):
            return payload
        result = LoaderTuneResult.from_dict(payload)
    report, blocks = loader_report(result, meta)
    from pitstop.tune.reports import SWEEP_HEADERS, sweep_rows

    print_table(args, "Measured DataLoader settings", SWEEP_HEADERS, sweep_rows(result))
    if args.plot:
        from pitstop.tune.reports import worker_curve

        xs, ys = worker_curve(result)
        _save_plot(
            args.plot,
            xs,
            {"batches/s": ys},
            title="DataLoader throughput",
            xlabel="num_workers",
            ylabel="batches/s",
        )
    return finish(report, args, blocks)


def _tune_args(args: argparse.Namespace, cfg: Any = None) -> dict[str, Any]:
    """What the in-process callback needs, as JSON (it crosses into the user's process by env var)."""
    from dataclasses import asdict

    d = {k: v for k, v in vars(args).items() if isinstance(v, str | int | float | bool | type(None))}
    if cfg is not None:
        d["tune_config"] = asdict(cfg)
    return d


def _in_script(
    args: argparse.Namespace, cmd: list[str], kind: str, meta: dict[str, Any], cfg: Any = None
) -> dict[str, Any] | int:
    """Script mode: run the ``kind`` tuner inside the script's own process (``pitstop.tune.script``).
    Its result as a dict, or the exit code after reporting why it could not run."""
    from pitstop.tune.script import run_callback

    meta["command"] = " ".join(cmd)
    name = "tune " + kind.replace("_", "-")
    with status(f"pitstop {name} (script)", not args.quiet):
        payload, error = run_callback(cmd, kind, _tune_args(args, cfg), args.timeout)
    return _script_failed(name, error, args) if payload is None else payload


def _script_failed(tool: str, error: str | None, args: argparse.Namespace) -> int:
    from pitstop.cliutil import finish
    from pitstop.findings import Finding, Report, Severity
    from pitstop.tune.script import INTERRUPTED

    report = Report(tool=tool, error=error or "the script ended before the tuner ran")
    if report.error.startswith(INTERRUPTED):  # Ctrl-C / SIGTERM: not a failure of the script
        report.meta["interrupted"] = True
        return finish(report, args)
    report.add(
        Finding(
            id="tune.script",
            severity=Severity.ERROR,
            title="Could not tune inside the script",
            evidence=error or "the script ended before it built what the tuner needs",
            fix="Check that the script runs on its own and builds a DataLoader / model / optimizer.",
        )
    )
    finish(report, args)
    return 1


# -------------------------------------------------------------------------------------- tune batch-size


def _register_batch_size(tsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = tsub.add_parser(
        "batch-size",
        help="find the largest batch size that fits (GPU memory, or a CPU memory budget)",
        description=(
            "Doubling then bisection over full training steps; CUDA OOM is caught and cleaned up; on CPU "
            "the step's peak tensor memory must stay inside --budget-mib. Throughput is measured at every size. "
            "Example: pitstop tune batch-size --model mypkg.models:make --dataset mypkg.data:make "
            "--optimizer adamw --budget-mib 4096"
        ),
    )
    add_options(p, BatchSizeArgs)
    add_output_args(p)
    p.set_defaults(func=cmd_tune_batch_size)


def cmd_tune_batch_size(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pitstop.cliutil import finish, usage_error
    from pitstop.tune.batch_size import BatchSizeResult, dataset_batch_fn, find_batch_size
    from pitstop.tune.reports import batch_size_report

    cmd = command_after_dashes(args)
    if args.start <= 0 or args.max < args.start or args.steps <= 0:
        return usage_error("need 0 < --start <= --max and --steps > 0")
    if args.budget_mib is not None and args.budget_mib <= 0:
        return usage_error("--budget-mib must be positive")
    if args.time_budget <= 0:
        return usage_error("--time-budget must be positive")
    if not args.quiet:
        say = (
            f"the search takes at most {args.time_budget:g} s (--time-budget); Ctrl-C keeps what it measured"
        )
        Console(stderr=True).print(f"pitstop tune batch-size: {say}")
    meta: dict[str, Any] = {"time_budget_s": args.time_budget}
    if cmd:
        payload = _in_script(args, cmd, "batch_size", meta)
        if isinstance(payload, int):
            return payload
        result = BatchSizeResult.from_dict(payload)
    else:
        if not (args.model and args.dataset):
            return usage_error("give --model and --dataset factories, or a script after --")
        try:
            model, dataset, loss, _device = _load_training(args)
            optimizer = optimizer_from_spec(args.optimizer, model.parameters())
        except Exception as e:
            return usage_error(f"cannot set up the model/dataset: {e}")
        meta.update(model=args.model, dataset=args.dataset, optimizer=args.optimizer)
        budget = int(args.budget_mib * MiB) if args.budget_mib else None
        with status("pitstop tune batch-size", not args.quiet) as update:
            result = find_batch_size(
                model,
                dataset_batch_fn(dataset),
                optimizer,
                loss,
                budget_bytes=budget,
                start=args.start,
                max_batch_size=args.max,
                steps=args.steps,
                progress=update,
                time_budget_s=args.time_budget,
            )
    report, blocks = batch_size_report(result, meta)
    rows = [
        [
            t.batch_size,
            t.status,
            None if t.peak_bytes is None else t.peak_bytes / MiB,
            t.samples_per_s,
            t.reason,
        ]
        for t in result.trials
    ]
    print_table(args, "Batch sizes tried", ["batch size", "status", "peak MiB", "samples/s", "note"], rows)
    return finish(report, args, blocks)


def _load_training(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    from pitstop.train.distributed import resolve_device

    device = resolve_device(args.device)
    model = load_model(args.model).to(device)
    dataset, _ = load_dataset(args.dataset)
    return model, dataset, load_loss(args.loss), device


# --------------------------------------------------------------------------------------------- tune lr


def _register_lr(tsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = tsub.add_parser(
        "lr",
        help="LR range test: loss vs an exponentially growing learning rate, suggested OneCycle max_lr",
        description=(
            "Smith's LR range test: the learning rate grows exponentially over --steps steps, the loss is "
            "smoothed, the test stops when it diverges; suggests OneCycleLR max_lr and CyclicLR bounds. "
            "Model and optimizer are restored afterwards. Example: pitstop tune lr --model m:make "
            "--dataset d:make --optimizer adamw --plot lr.png"
        ),
    )
    add_options(p, LRArgs)
    add_output_args(p)
    p.set_defaults(func=cmd_tune_lr)


def cmd_tune_lr(args: argparse.Namespace) -> int:
    from pitstop.cliutil import finish, usage_error
    from pitstop.tune.lr import LRResult, lr_range_test
    from pitstop.tune.reports import lr_report

    cmd = command_after_dashes(args)
    if (
        not (0 < args.start_lr < args.end_lr)
        or args.steps < 3
        or not (0 <= args.smooth < 1)
        or args.diverge <= 1
    ):
        return usage_error("need 0 < --start-lr < --end-lr, --steps >= 3, 0 <= --smooth < 1, --diverge > 1")
    meta: dict[str, Any] = {}
    if cmd:
        payload = _in_script(args, cmd, "lr", meta)
        if isinstance(payload, int):
            return payload
        result = LRResult.from_dict(payload)
    else:
        if not (args.model and args.dataset):
            return usage_error("give --model and --dataset factories, or a script after --")
        try:
            from torch.utils.data import DataLoader

            model, dataset, loss, _device = _load_training(args)
            optimizer = optimizer_from_spec(args.optimizer, model.parameters(), lr=args.start_lr)
            loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
        except Exception as e:
            return usage_error(f"cannot set up the model/dataset: {e}")
        meta.update(model=args.model, dataset=args.dataset, optimizer=args.optimizer)
        with status("pitstop tune lr", not args.quiet) as update:
            result = lr_range_test(
                model,
                loader,
                optimizer,
                loss,
                start_lr=args.start_lr,
                end_lr=args.end_lr,
                num_steps=args.steps,
                beta=args.smooth,
                diverge=args.diverge,
                progress=lambda i, n: update(f"step {i}/{n}"),
            )
    report, blocks = lr_report(result, meta)
    if args.plot and result.lrs:
        from pitstop.tune.reports import lr_plot_series

        marks = {"max_lr": result.suggested_max_lr} if result.suggested_max_lr else None
        _save_plot(
            args.plot,
            result.lrs,
            lr_plot_series(result),
            title="LR range test",
            xlabel="learning rate",
            ylabel="loss",
            logx=True,
            marks=marks,
        )
    return finish(report, args, blocks)
