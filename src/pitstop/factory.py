"""Load a user object from a ``pkg.module:attr`` spec (model factories, dataset factories, loaders)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
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
