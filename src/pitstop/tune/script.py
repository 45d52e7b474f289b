"""Script mode: tune what the user's own script builds, inside its own process.

Parent side: ``run_callback`` runs the script through the profile runner with one of the callbacks below
and returns what it sent back. Child side: the callbacks receive ``pitstop.profile.capture.hooks.Captured`` (the
DataLoader the script built with its kwargs and file:line; the model, optimizer and device after the
warm-up steps), run the same library code as factory mode, and return a JSON-able result. The tune
arguments cross the process boundary as JSON in the ``PITSTOP_TUNE_ARGS`` environment variable.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ENV = "PITSTOP_TUNE_ARGS"
INTERRUPTED = "interrupted (Ctrl-C or SIGTERM)"
PARTIAL_ENV = "PITSTOP_TUNE_PARTIAL"  # where a tuner writes what it measured so far (a stop may kill it)
CALLBACKS = {"loader": "loader", "batch_size": "step", "lr": "step"}  # what -> callback_at
STEPS_UNBOUNDED = 10**9  # the callback's own training steps must not end the run


def run_callback(
    command: list[str], what: str, args: dict[str, Any], timeout: float | None = None
) -> tuple[Any, str | None]:
    """Run the script with the ``what`` callback; (callback result or None, error text or None). A run
    Ctrl-C or SIGTERM stopped before the callback returned gives what the tuner wrote to its partial
    file so far (the batch-size search writes one after every size, the loader tuner after every
    point), marked interrupted."""
    from pitstop.profile.runs.runner import RunSpec, run

    with tempfile.TemporaryDirectory(prefix="pitstop-tune-") as tmp:
        partial = Path(tmp) / "partial.json"
        spec = RunSpec(
            command=list(command),
            steps=STEPS_UNBOUNDED,
            warmup=1,
            timeout=timeout,
            callback=f"pitstop.tune.script:{what}_callback",
            callback_at=CALLBACKS[what],
            env={ENV: json.dumps(args), PARTIAL_ENV: str(partial)},
            probes=False,
        )
        result = run(spec)
        if result.callback_result is None and result.status == "interrupted":
            with contextlib.suppress(OSError, ValueError):  # killed mid-size: the sizes it finished
                return {**json.loads(partial.read_text()), "interrupted": True}, None
    if result.callback_result is not None:
        return result.callback_result, None
    if result.status == "interrupted":
        return None, f"{INTERRUPTED} before the tuner in the script returned what it measured"
    error = result.error
    if error is None:
        need = "a DataLoader" if what == "loader" else "a training step (model + optimizer)"
        error = f"the script ended ({result.status}) before it built {need}, so the tuner never ran"
    return None, error


# ------------------------------------------------------------------------------------------ child side


def _args() -> dict[str, Any]:
    return json.loads(os.environ.get(ENV) or "{}")


def _say(msg: str) -> None:
    print(f"pitstop tune: {msg}", file=sys.stderr, flush=True)


def loader_callback(captured: Any) -> dict[str, Any]:
    from pitstop.tune.loader import tune_config_from_dict, tune_loader

    if not captured.loaders:
        raise RuntimeError("no DataLoader was captured")
    cap = captured.loaders[0]
    base = {k: v for k, v in cap.kwargs.items() if k != "dataset"}
    cfg = tune_config_from_dict(_args().get("tune_config") or {})
    result = tune_loader(
        cap.dataset, base, cfg, progress=_say, location=cap.location, on_point=_write_partial
    )
    return result.to_dict()


def _model_and_optimizer(captured: Any) -> tuple[Any, Any]:
    if not captured.models:
        raise RuntimeError("no model was seen running forward before the first optimizer step")
    model = captured.models[0]
    params = {id(p) for p in model.parameters()}
    optimizer = next(
        (o for o in captured.optimizers if any(id(p) in params for g in o.param_groups for p in g["params"])),
        captured.optimizers[0] if captured.optimizers else None,
    )
    return model, optimizer


def _loss(args: dict[str, Any]) -> Any:
    from pitstop.factory import load_object

    return load_object(args["loss"]) if args.get("loss") else None


def batch_from_last(last_batch: Any) -> Any:
    """A batch function that repeats the rows of the last batch the script loaded (no dataset needed)."""
    import torch

    def take(obj: Any, bs: int) -> Any:
        if isinstance(obj, torch.Tensor) and obj.dim() > 0:
            reps = -(-bs // obj.shape[0])
            return obj.repeat(reps, *([1] * (obj.dim() - 1)))[:bs].cpu()
        if isinstance(obj, dict):
            return {k: take(v, bs) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(take(v, bs) for v in obj)
        return obj

    return lambda bs: take(last_batch, bs)


def batch_size_callback(captured: Any) -> dict[str, Any]:
    from pitstop.tune.batch_size import TIME_BUDGET_S, dataset_batch_fn, find_batch_size
    from pitstop.units import MiB

    args = _args()
    model, optimizer = _model_and_optimizer(captured)
    if captured.loaders and hasattr(captured.loaders[0].dataset, "__getitem__"):
        cap = captured.loaders[0]
        batch_fn = dataset_batch_fn(cap.dataset, cap.kwargs.get("collate_fn"))
    elif captured.last_batch is not None:
        batch_fn = batch_from_last(captured.last_batch)
    else:
        raise RuntimeError("no dataset or batch was seen to build batches from")
    budget = int(args["budget_mib"] * MiB) if args.get("budget_mib") else None
    result = find_batch_size(
        model,
        batch_fn,
        optimizer,
        _loss(args),
        budget_bytes=budget,
        start=int(args.get("start") or 2),
        max_batch_size=int(args.get("max") or 65536),
        steps=int(args.get("steps") or 3),
        progress=_say,
        time_budget_s=args.get("time_budget", TIME_BUDGET_S),
        on_trial=_write_partial,
    )
    return result.to_dict()


def _write_partial(result: Any) -> None:
    """What was measured so far (sizes, loader points), for the parent should the script be killed
    mid-measurement."""
    from pitstop.report.jsonfmt import atomic_write_text

    path = os.environ.get(PARTIAL_ENV)
    if path:
        with contextlib.suppress(OSError):
            atomic_write_text(Path(path), json.dumps(result.to_dict()))


def lr_callback(captured: Any) -> dict[str, Any]:
    from pitstop.tune.lr import lr_range_test

    args = _args()
    model, optimizer = _model_and_optimizer(captured)
    if optimizer is None:
        raise RuntimeError("no optimizer was constructed")
    if not captured.loaders:
        raise RuntimeError("no DataLoader was captured (the LR test needs the script's batches)")
    result = lr_range_test(
        model,
        captured.loaders[0].loader,
        optimizer,
        _loss(args),
        start_lr=float(args.get("start_lr") or 1e-7),
        end_lr=float(args.get("end_lr") or 10.0),
        num_steps=int(args.get("steps") or 100),
        beta=float(args.get("smooth", 0.98)),
        diverge=float(args.get("diverge") or 4.0),
    )
    return result.to_dict()
