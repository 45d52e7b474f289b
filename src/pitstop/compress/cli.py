"""`pitstop compress report --model pkg.mod:factory --data pkg.mod:loader [...]`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from pitstop.cliopts import add_options, opt
from pitstop.cliutil import (
    add_output_args,
    comma_list,
    finish,
    progress_bar,
    shows_tables,
    status,
    usage_error,
)


@dataclass
class CompressReportArgs:
    model: str = opt(help="the trained model (or factory)", metavar="SPEC")
    data: str = opt(help="eval data: (input, target) batches", metavar="SPEC")
    train_data: str | None = opt(
        None, "training batches: fine-tune after pruning, train students", metavar="SPEC"
    )
    calib_data: str | None = opt(
        None, "static int8 calibration (default: train data, else eval data)", metavar="SPEC"
    )
    student: str | None = opt(
        None, "an untrained student model factory; adds student/distill rows", metavar="SPEC"
    )
    methods: str | None = opt(
        None,
        "comma-separated, from dynamic_int8, static_int8, int8_weight_only, prune_global, prune_structured, "
        "student, distill (default: dynamic_int8,static_int8,prune_global,prune_structured, plus "
        "student,distill with --student)",
        metavar="LIST",
    )
    prune_amount: float = opt(0.5, "global unstructured fraction (default 0.5)")
    structured_amount: float = opt(0.3, "channel fraction per layer (default 0.3)")
    keep_channels: bool = opt(
        False, "structured pruning: keep zeroed channels in place (default: remove them where exact)"
    )
    finetune_steps: int = opt(100, "fine-tune steps after pruning (default 100)")
    distill_steps: int = opt(200, "student training steps (default 200)")
    temperature: float = opt(4.0, "distillation temperature (default 4)", flags=("--temperature", "-T"))
    alpha: float = opt(0.9, "weight of the teacher term (default 0.9)")
    lr: float = opt(1e-3, "fine-tune / student learning rate (default 1e-3)")
    batch: int | None = opt(None, "batch N for latency (default: the eval batch size)", metavar="N")
    eval_batches: int | None = opt(None, "accuracy on the first K eval batches only", metavar="K")
    threads: int | None = opt(None, "torch threads for latency (default: torch's current setting)")
    min_run_time: float = opt(0.5, "seconds of timing per model and batch size", metavar="S")
    rounds: int = opt(3, "interleaved latency rounds over all models (default 3)")
    max_acc_drop: float = opt(1.0, "accuracy points a method may lose (default 1)", metavar="POINTS")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compress",
        help="quantization, pruning and distillation, with size, latency and accuracy measured",
        description="Compress a model and measure each method against the baseline on this machine.",
    )
    csub = p.add_subparsers(dest="compress_command", required=True, metavar="SUBCOMMAND")
    r = csub.add_parser(
        "report",
        help="baseline vs each method: params, size on disk, latency (batch 1 and N), accuracy, sparsity",
        description="Measure the model and each compression method on the given eval data. A spec is "
        "'pkg.module:name' or 'path/file.py:name'; a model spec names an nn.Module or a function returning "
        "one (trained); a data spec names a DataLoader, an iterable of (input, target) batches, a Dataset, "
        "or a function returning one of these.",
    )
    add_options(r, CompressReportArgs)
    add_output_args(r)
    r.set_defaults(func=cmd_compress_report)


def _load_data(spec: str, batch_size: int) -> Any:
    """A re-iterable of batches: loaders pass through, datasets are batched, one-shot iterators kept."""
    from torch.utils.data import DataLoader, Dataset

    from pitstop.factory import load_object

    obj = load_object(spec)
    if callable(obj) and not hasattr(obj, "__iter__") and not isinstance(obj, Dataset):
        obj = obj()
    if isinstance(obj, Dataset):  # map-style or iterable-style dataset: batch it
        return DataLoader(obj, batch_size=batch_size)
    if not hasattr(obj, "__iter__"):
        raise ValueError(f"{spec} gave a {type(obj).__name__}, not a loader or iterable of batches")
    if iter(obj) is obj:  # a generator: read once, keep the batches so every method sees the same data
        obj = list(obj)
    return obj


def _parse_methods(text: str | None) -> tuple[str, ...]:
    from pitstop.compress.table import ALL_METHODS, DEFAULT_METHODS

    if not text:
        return DEFAULT_METHODS
    methods = comma_list(text)
    bad = [m for m in methods if m not in ALL_METHODS]
    if bad:
        raise ValueError(f"unknown method(s): {', '.join(bad)} (choose from {', '.join(ALL_METHODS)})")
    return methods


def cmd_compress_report(args: argparse.Namespace) -> int:
    if not 0 <= args.prune_amount < 1 or not 0 <= args.structured_amount < 1:
        return usage_error("--prune-amount and --structured-amount must be in [0, 1)")
    if args.temperature <= 0 or not 0 <= args.alpha <= 1:
        return usage_error("--temperature must be > 0 and --alpha in [0, 1]")
    if (args.batch is not None and args.batch < 1) or (args.threads is not None and args.threads < 1):
        return usage_error("--batch and --threads must be >= 1")
    if args.min_run_time <= 0 or args.rounds < 1 or args.finetune_steps < 0 or args.distill_steps < 0:
        return usage_error("--min-run-time must be > 0, --rounds >= 1 and step counts >= 0")
    try:
        methods = _parse_methods(args.methods)
    except ValueError as e:
        return usage_error(str(e))
    if args.student and not args.methods:
        methods = (*methods, "student", "distill")

    from rich.console import Console

    from pitstop.compress.render import compress_blocks, rows_table
    from pitstop.compress.report import compress_report
    from pitstop.compress.table import ReportOptions
    from pitstop.factory import FactoryError, load_model

    show = shows_tables(args)
    try:
        with status("loading model and data", show):
            model = load_model(args.model)
            batch = args.batch or 64
            eval_data = _load_data(args.data, batch)
            train_data = _load_data(args.train_data, batch) if args.train_data else None
            calib_data = _load_data(args.calib_data, batch) if args.calib_data else None
            student = _load_student(args.student) if args.student else None
    except (FactoryError, ValueError, TypeError, RuntimeError) as e:
        return usage_error(f"cannot load: {e}")
    except Exception as e:  # user code raised while building its model or data
        return usage_error(f"loading failed in user code: {type(e).__name__}: {e}")

    opts = ReportOptions(
        methods=methods,
        prune_amount=args.prune_amount,
        structured_amount=args.structured_amount,
        remove_channels=not args.keep_channels,
        finetune_steps=args.finetune_steps,
        lr=args.lr,
        distill_steps=args.distill_steps,
        temperature=args.temperature,
        alpha=args.alpha,
        eval_batches=args.eval_batches,
        batch_n=args.batch,
        threads=args.threads,
        min_run_time=args.min_run_time,
        latency_rounds=args.rounds,
        max_acc_drop=args.max_acc_drop / 100.0,
    )
    meta = {"model": args.model, "data": args.data, "train_data": args.train_data, "student": args.student}
    with progress_bar("compress:", show) as bar:
        task = bar.add_task("baseline", total=len(methods) + 1)

        def progress(name: str, done: int, total: int) -> None:
            bar.update(task, description=name, completed=done, total=total)

        try:
            report = compress_report(model, eval_data, opts, train_data, calib_data, student, progress, meta)
        except ValueError as e:
            return usage_error(str(e))
    if show:
        Console().print(rows_table(report))
    return finish(report, args, compress_blocks(report))


def _load_student(spec: str) -> Any:
    """The student factory itself (called once per student row), or a module to copy."""
    import torch

    from pitstop.factory import load_object

    obj = load_object(spec)
    if isinstance(obj, torch.nn.Module):
        return obj
    if not callable(obj):
        raise ValueError(f"{spec} is neither a torch.nn.Module nor a function returning one")
    probe = obj()
    if not isinstance(probe, torch.nn.Module):
        raise ValueError(f"{spec} returned a {type(probe).__name__}, not a torch.nn.Module")
    return obj
