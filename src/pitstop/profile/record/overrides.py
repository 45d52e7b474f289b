"""Candidate fixes injected into the user's process (``pitstop fix`` proves them by re-running).

``Overrides`` is the optimization settings (``pitstop.recipes.knobs.Knobs``) plus the two DDP injections.
It crosses the process boundary as JSON; the hooks in the child apply it (``pitstop.profile.capture.hooks``).
Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.recipes import dataloader
from pitstop.recipes.knobs import AUTOCAST_DTYPES, DATALOADER_KEYS, OPTIMIZER_IMPLS, Knobs

__all__ = ["AUTOCAST_DTYPES", "DATALOADER_KEYS", "OPTIMIZER_IMPLS", "Overrides"]


@dataclass(frozen=True, kw_only=True)
class Overrides(Knobs):
    """Settings forced on the user's script without editing it: every ``Knobs`` field, injected
    (``channels_last``: the top-level model, the module that runs forward, and its 4-D float inputs;
    ``autocast``: around the top-level forward; ``float32``: a float64 model at its first forward, its
    float64 inputs, and its float32 outputs float64 again; ``keep_host_memory``:
    before the script runs; ``tf32``, ``cudnn_benchmark``: on each model's device (CUDA) at its first
    forward (``pitstop.profile.capture.models``);
    ``optimizer_impl``: on every optimizer constructed; ``compile``: the
    top-level model; ``num_threads``: also when the script sets its own, in every rank of a launcher,
    ``pitstop.profile.rank.rank_worker``), and:

    ddp_no_sync:    micro-batches per optimizer step: every DDP forward but each k-th one after the
                    first optimizer step runs without gradient sync, as under ``model.no_sync()``; the
                    sum of the accumulated gradients is all-reduced once (``pitstop.recipes.step``).
    ddp_static_graph: ``static_graph=True`` on every DDP model the script builds.
    """

    ddp_no_sync: int | None = None
    ddp_static_graph: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ddp_no_sync is not None and self.ddp_no_sync < 2:
            raise ValueError(f"ddp_no_sync needs at least 2 micro-batches per step, got {self.ddp_no_sync}")

    @classmethod
    def workers(cls, n: int) -> Overrides:
        """The workers fix: ``n`` DataLoader worker processes, kept between epochs (what ``pitstop fix``
        times and what the profile's fresh runs confirm the workers finding with)."""
        return cls(dataloader=dataloader.workers_fix(n))
