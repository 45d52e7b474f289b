"""What the probes installed in the user's process (``loaders``, ``models``, ``torchcalls``) call and read
on the run's ``Instrumentation`` (``hooks``): its points and the state they share, as a Protocol.

``hooks`` installs the probes, so they name this interface instead of importing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from pitstop.profile.capture.stepclock import StepClock
    from pitstop.profile.record.captured import Captured, CapturedLoader
    from pitstop.profile.record.overrides import Overrides


class RunSettings(Protocol):
    """The part of the instrumentation's ``Config`` the probes read."""

    @property
    def overrides(self) -> Overrides: ...


class ProbePoints(Protocol):
    """The points every probe calls (a step's phases and boundaries) and the run's state they read or add to."""

    captured: Captured  # the script's models, loaders, optimizers, last inputs
    clock: StepClock
    in_next: bool  # inside DataLoader.__next__
    in_backward: bool  # inside a top-level backward call
    compile_error: str | None
    model_facts: dict[int, dict[str, Any]]
    optimizer_facts: list[dict[str, Any]]
    override_errors: list[str]

    @property
    def cfg(self) -> RunSettings: ...

    def boundary(self, now: float) -> None: ...
    def adopt_loader(self, loader: Any, where: str | None = None) -> CapturedLoader: ...
    def loader_built(self, cap: CapturedLoader) -> None: ...
    def data_begin(self, now: float) -> None: ...
    def data_end(self, now: float) -> None: ...
    def batch_loaded(self, batch: Any) -> None: ...
    def copy_begin(self, now: float) -> None: ...
    def copy_end(self, now: float, device: torch.device | None, events: Any = None) -> None: ...
    def forward_begin(self, module: torch.nn.Module, args: tuple[Any, ...]) -> Any: ...
    def forward_end(self, module: torch.nn.Module, output: Any, now: float | None = None) -> Any: ...
    def backward_begin(self, loss: torch.Tensor | None, now: float) -> None: ...
    def backward_end(self, now: float, failed: bool = False) -> None: ...
    def optimizer_begin(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any: ...
    def optimizer_end(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None: ...
