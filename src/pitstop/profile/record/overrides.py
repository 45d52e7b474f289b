"""Candidate fixes injected into the user's process (``pitstop fix`` proves them by re-running).

The dataclass crosses the process boundary as JSON; the hooks in the child apply it
(``pitstop.profile.capture.hooks``). Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pitstop.recipes import RECIPES

# DataLoader keyword arguments an override may force (the recipes' ``dataloader.<key>`` overrides, and
# the two the loader tuner sets); anything else is rejected up front.
DATALOADER_KEYS = frozenset({"prefetch_factor", "batch_size"}) | {
    r.override.partition(".")[2] for r in RECIPES if r.override and r.override.startswith("dataloader.")
}
AUTOCAST_DTYPES = frozenset({"bfloat16", "float16"})
OPTIMIZER_IMPLS = frozenset({"foreach", "fused"})


@dataclass
class Overrides:
    """Settings forced on the user's script without editing it.

    dataloader:     kwargs forced on every DataLoader the script builds (keys in ``DATALOADER_KEYS``).
    channels_last:  the top-level model (the module that runs forward) and its 4-D float inputs.
    autocast:       "bfloat16" / "float16": autocast around the top-level forward.
    float32:        a float64 model's parameters and buffers become float32 at its first forward, its
                    float64 inputs float32 and its float32 outputs float64 again (the loss and what
                    follows run as before).
    cudnn_benchmark: ``torch.backends.cudnn.benchmark = True`` before the script runs.
    optimizer_impl: "foreach" or "fused" set on every optimizer constructed (where supported).
    compile:        ``torch.compile`` the top-level model; errors fall back to eager (recorded).
    keep_host_memory: ``pitstop.train.keep_host_memory()`` before the script runs (glibc keeps freed
                    blocks mapped, so steps stop page-faulting their tensors in).
    num_threads:    intra-op threads of each process (``torch.set_num_threads``), also when the script
                    sets its own; applied in every rank of a launcher (``pitstop.profile.rank.rank_worker``).
    ddp_no_sync:    micro-batches per optimizer step: every DDP forward but each k-th one after the
                    first optimizer step runs without gradient sync, as under ``model.no_sync()``; the
                    sum of the accumulated gradients is all-reduced once (``pitstop.train.ddp_inject``).
    ddp_static_graph: ``static_graph=True`` on every DDP model the script builds.
    """

    dataloader: dict[str, Any] = field(default_factory=dict)
    channels_last: bool = False
    autocast: str | None = None
    float32: bool = False
    cudnn_benchmark: bool = False
    optimizer_impl: str | None = None
    compile: bool = False
    keep_host_memory: bool = False
    num_threads: int | None = None
    ddp_no_sync: int | None = None
    ddp_static_graph: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.dataloader) - DATALOADER_KEYS
        if unknown:
            raise ValueError(f"unsupported DataLoader override(s): {sorted(unknown)}")
        if self.autocast is not None and self.autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast must be one of {sorted(AUTOCAST_DTYPES)}, got {self.autocast!r}")
        if self.optimizer_impl is not None and self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ValueError(
                f"optimizer_impl must be one of {sorted(OPTIMIZER_IMPLS)}, got {self.optimizer_impl!r}"
            )

        if self.ddp_no_sync is not None and self.ddp_no_sync < 2:
            raise ValueError(f"ddp_no_sync needs at least 2 micro-batches per step, got {self.ddp_no_sync}")

    @classmethod
    def setting(cls, override: str | None, value: Any) -> Overrides:
        """One override as a recipe names it (``pitstop.recipes``): a field (``"compile"``) or a DataLoader
        keyword (``"dataloader.pin_memory"``), set to ``value``."""
        if not override:
            raise ValueError("no override named")
        head, _, key = override.partition(".")
        if head == "dataloader" and key:
            return cls(dataloader={key: value})
        if head not in {f.name for f in fields(cls)} or key:
            raise ValueError(f"Overrides has no field {override!r}")
        return cls(**{head: value})

    @classmethod
    def workers(cls, n: int) -> Overrides:
        """The workers fix: ``n`` DataLoader worker processes, kept between epochs (what ``pitstop fix``
        times and what the profile's fresh runs confirm the workers finding with)."""
        return cls(dataloader={"num_workers": n, "persistent_workers": True})

    def is_empty(self) -> bool:
        return self == Overrides()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Overrides:
        d = d or {}
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def describe(self) -> str:
        """Short human form, e.g. ``num_workers=2, autocast=bfloat16``."""
        parts = [f"{k}={v}" for k, v in self.dataloader.items()]
        parts += [
            f"{f.name}={getattr(self, f.name)}"
            for f in fields(self)
            if f.name != "dataloader" and getattr(self, f.name) not in (False, None)
        ]
        return ", ".join(parts) or "none"
