"""``Knobs``: the optimization settings, declared once. A run of a script can have them injected
(``pitstop.profile.record.overrides.Overrides`` is ``Knobs`` plus the DDP injections), a bench row ablates
them (``pitstop.bench.configs.BenchConfig`` is ``Knobs`` plus the row's own settings), and
``pitstop.train.TrainConfig.knobs()`` says which ones ``fit`` turns on.

A recipe's ``override`` (``pitstop.recipes.entries.Recipe``) names its knob: a field here, or
``dataloader.<keyword>`` for a DataLoader keyword; ``Knobs.setting`` turns one on by that name. The record
is frozen and keyword-only (a subclass keeps its own positional fields first), and imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypeVar

from pitstop.recipes import autocast, dataloader, optimizer_impl

AUTOCAST_DTYPES = frozenset(autocast.DTYPES)
OPTIMIZER_IMPLS = frozenset(optimizer_impl.IMPLS)
# DataLoader keywords a knob may force: the loader components' (the registry checks its ``dataloader.<key>``
# knobs name only these), and the two the loader tuner sets
DATALOADER_KEYS = frozenset(dataloader.KEYS)

K = TypeVar("K", bound="Knobs")


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """The optimization settings. The defaults leave the script or model as it is.

    dataloader:     keywords forced on every DataLoader (keys in ``DATALOADER_KEYS``): ``num_workers``,
                    ``pin_memory``, ``persistent_workers``, ``prefetch_factor``, ``batch_size``.
    channels_last:  the model and its 4-D float inputs in channels_last (``pitstop.recipes.channels_last``).
    autocast:       "bfloat16" / "float16": autocast around the forward.
    float32:        a float64 model and its float64 inputs as float32 (the loss and what follows as before).
    cudnn_benchmark: ``torch.backends.cudnn.benchmark = True``.
    tf32:           TF32 matmuls and convolutions on CUDA (``pitstop.recipes.tf32``; nothing elsewhere).
    optimizer_impl: "foreach" or "fused" set on the optimizer (where supported).
    compile:        ``torch.compile`` the model; errors fall back to eager (recorded).
    keep_host_memory: ``pitstop.train.keep_host_memory()`` before the loop (glibc keeps freed blocks mapped).
    num_threads:    intra-op threads of each process (``torch.set_num_threads``).
    """

    dataloader: Mapping[str, Any] = field(default_factory=dict)
    channels_last: bool = False
    autocast: str | None = None
    float32: bool = False
    cudnn_benchmark: bool = False
    tf32: bool = False
    optimizer_impl: str | None = None
    compile: bool = False
    keep_host_memory: bool = False
    num_threads: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dataloader", dict(self.dataloader))
        unknown = set(self.dataloader) - DATALOADER_KEYS
        if unknown:
            raise ValueError(f"unsupported DataLoader override(s): {sorted(unknown)}")
        if self.autocast is not None and self.autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast must be one of {sorted(AUTOCAST_DTYPES)}, got {self.autocast!r}")
        if self.optimizer_impl is not None and self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ValueError(
                f"optimizer_impl must be one of {sorted(OPTIMIZER_IMPLS)}, got {self.optimizer_impl!r}"
            )

    # DataLoader keywords, typed
    @property
    def num_workers(self) -> int:
        return int(self.dataloader.get("num_workers") or 0)

    @property
    def pin_memory(self) -> bool:
        return bool(self.dataloader.get("pin_memory"))

    def with_setting(self: K, knob: str | None, value: Any) -> K:
        """A copy with the knob a recipe names (``pitstop.recipes``: a field, ``"compile"``, or a DataLoader
        keyword, ``"dataloader.pin_memory"``) set to ``value``."""
        if not knob:
            raise ValueError("no override named")
        head, _, key = knob.partition(".")
        if head == "dataloader" and key:
            return replace(self, dataloader={**self.dataloader, key: value})
        if head not in knob_names(type(self)) or key:
            raise ValueError(f"{type(self).__name__} has no field {knob!r}")
        return replace(self, **{head: value})

    @classmethod
    def setting(cls: type[K], knob: str | None, value: Any) -> K:
        """One knob as a recipe names it, set to ``value``; the rest at their defaults."""
        return cls().with_setting(knob, value)

    def is_empty(self) -> bool:
        return self == type(self)()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls: type[K], d: Mapping[str, Any] | None) -> K:
        names = knob_names(cls)
        return cls(**{k: v for k, v in (d or {}).items() if k in names})

    def describe(self) -> str:
        """Short human form, e.g. ``num_workers=2, autocast=bfloat16``."""
        parts = [f"{k}={v}" for k, v in self.dataloader.items()]
        parts += [
            f"{f.name}={getattr(self, f.name)}"
            for f in fields(self)
            if f.name != "dataloader" and f.init and getattr(self, f.name) not in (False, None)
        ]
        return ", ".join(parts) or "none"


def knob_names(cls: type[Knobs] = Knobs) -> frozenset[str]:
    """The constructor's field names of ``cls`` (``Knobs`` or a record built on it)."""
    return frozenset(f.name for f in fields(cls) if f.init)


def knob_fields() -> frozenset[str]:
    """The fields of ``Knobs`` itself: the optimization settings."""
    return knob_names(Knobs)


def knobs_of(record: Knobs) -> Knobs:
    """Only the ``Knobs`` part of a record built on it (an ``Overrides``, a ``BenchConfig``)."""
    return Knobs(**{name: getattr(record, name) for name in knob_fields()})


__all__ = [
    "AUTOCAST_DTYPES",
    "DATALOADER_KEYS",
    "OPTIMIZER_IMPLS",
    "Knobs",
    "knob_fields",
    "knob_names",
    "knobs_of",
]
