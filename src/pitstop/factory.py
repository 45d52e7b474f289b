"""Load a user object from a ``pkg.module:attr`` spec (model factories, dataset factories, loaders), and the
models, datasets, optimizers and losses the tune and compress commands build from such specs."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class FactoryError(ValueError):
    """The spec is malformed, or the module or attribute cannot be found."""


def load_object(spec: str) -> Any:
    """``pkg.mod:name`` or ``path/to/file.py:name`` -> the object. Dotted names after ':' walk attributes."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise FactoryError(f"expected 'module:attribute' or 'file.py:attribute', got {spec!r}")
    try:
        if mod_name.endswith(".py") or "/" in mod_name:
            path = Path(mod_name).resolve()
            if not path.is_file():
                raise FactoryError(f"no such file: {mod_name}")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert module_spec and module_spec.loader
            module = importlib.util.module_from_spec(module_spec)
            sys.modules.setdefault(path.stem, module)
            module_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(mod_name)
    except ImportError as e:
        raise FactoryError(f"cannot import {mod_name!r}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise FactoryError(f"{mod_name!r} has no attribute {attr!r}") from e
    return obj


def loader_kwargs(loader: Any) -> dict[str, Any]:
    """The keywords that rebuild ``loader`` (a DataLoader object) with its own sampler and collate_fn."""
    kw: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "collate_fn": loader.collate_fn,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
    }
    if loader.num_workers > 0:
        kw["prefetch_factor"] = loader.prefetch_factor
        kw["persistent_workers"] = loader.persistent_workers
    if loader.batch_size is None:
        kw["batch_sampler"] = loader.batch_sampler
    else:
        kw.update(batch_size=loader.batch_size, drop_last=loader.drop_last, sampler=loader.sampler)
    return {k: v for k, v in kw.items() if v is not None}


def load_dataset(spec: str) -> tuple[Any, dict[str, Any]]:
    """A factory spec -> (dataset, DataLoader kwargs when the factory gave a DataLoader)."""
    from torch.utils.data import DataLoader, Dataset

    obj = load_object(spec)
    if callable(obj) and not isinstance(obj, Dataset | DataLoader):
        obj = obj()
    if isinstance(obj, DataLoader):
        return obj.dataset, loader_kwargs(obj)
    if not hasattr(obj, "__getitem__") and not hasattr(obj, "__iter__"):
        raise ValueError(f"{spec} gave a {type(obj).__name__}, not a Dataset or DataLoader")
    return obj, {}


def load_model(spec: str) -> Any:
    """An nn.Module, or a function returning one, named by a spec."""
    import torch

    obj = load_object(spec)
    if not isinstance(obj, torch.nn.Module) and callable(obj):
        obj = obj()
    if not isinstance(obj, torch.nn.Module):
        raise ValueError(f"{spec} gave a {type(obj).__name__}, not a torch.nn.Module")
    return obj


def optimizer_from_spec(spec: str, params: Any, lr: float = 1e-3) -> Any:
    """``sgd`` (momentum 0.9), ``adam``, ``adamw``, or a ``pkg.mod:fn`` spec called as fn(params)."""
    import torch

    name = spec.lower()
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    return load_object(spec)(params)


def load_loss(spec: str | None) -> Callable[[Any, Any], Any] | None:
    """The loss function a spec names (called as fn(model, batch)), or None for no spec."""
    return load_object(spec) if spec else None
