"""What a component's ``fix --apply`` edit may do to the user's script, by surface: the editor protocols
``pitstop.fix.apply`` implements (placing each line with ``ast``), and the one edit process components
share. A component's ``edit`` takes the editor of its surface and returns the knobs it wrote."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol


class ScriptEditor(Protocol):
    """What a component's ``fix --apply`` edit may do to the script, at the model's first forward call
    (``MODEL``, ``FORWARD``, ``DTYPE``, ``WRAP``). ``setting``: the knob's value in the fix (autocast's dtype), ``device``: the
    run's device type. Each method returns the name it wrote the line for;
    ``pitstop.fix.apply.Unplaced`` when the place cannot be found."""

    setting: Any
    device: str

    def reassign_model(self, value: Callable[[str], str]) -> str:
        """``model = value("model")`` after the statement that assigns the model called at the forward."""
        ...

    def model_statement(self, line: Callable[[str], str]) -> str:
        """``line("model")`` as a statement of its own (e.g. ``model.compile()``) after the statement that
        assigns the model called at the forward."""
        ...

    def reassign_input(self, value: Callable[[str], str]) -> str:
        """``x = value("x")`` for the forward's first argument ``x`` (a plain name): after the statement
        that moves it with ``.to(...)``, else before the forward's statement."""
        ...

    def reassign_indexed(self, value: Callable[[str], str]) -> str | None:
        """Where the forward's first argument indexes a tensor (``model(x_all[idx])``): ``x_all =
        value("x_all")`` once after the statement that makes it; the name, or None where the argument is
        no such subscript."""
        ...

    def wrap_forward(self, header: str) -> None:
        """The statements from the forward's up to the one that calls ``.backward()`` (forward and loss)
        indented under ``header`` (``with ...:``)."""
        ...

    def need_torch(self) -> None:
        """``import torch`` beside the script's imports, where it has none."""
        ...


class OptimizerEditor(Protocol):
    """What an ``OPTIMIZER`` component's ``fix --apply`` edit may do: keywords on the constructor call of
    every optimizer the run recorded. ``setting``: the knob's value in the fix."""

    setting: Any

    def keywords(self, values: Mapping[str, Any]) -> None:
        """``values`` as keyword arguments of each recorded optimizer's constructor call."""
        ...


class ProcessEditor(Protocol):
    """What a ``PROCESS`` component's ``fix --apply`` edit may do: lines first in the script's main (or
    its ``if __name__ == "__main__":`` block, or after its imports). ``setting``: the knob's value in the
    fix, ``device``: the run's device type."""

    setting: Any
    device: str

    def first_lines(self, code: str) -> None:
        """``code``'s lines, each indented as the statement they go before."""
        ...

    def need_torch(self) -> None:
        """``import torch`` beside the script's imports, where it has none."""
        ...


class LoaderEditor(Protocol):
    """What a ``LOADER`` component's ``fix --apply`` edit may do: keywords on the ``DataLoader(...)`` call
    the run waited on most. ``setting``: the knob's value in the fix."""

    setting: Any

    def keywords(self, values: Mapping[str, Any]) -> None:
        """``values`` as keyword arguments of the loader's constructor call (replacing the script's)."""
        ...


def edit_first_lines(editor: ProcessEditor, snippet: str, knob: str) -> dict[str, Any]:
    """A process component's ``fix --apply`` edit: ``snippet`` first in the script's main (or its
    ``__main__`` block, or after its imports), with ``import torch`` where the script has none."""
    editor.first_lines(snippet)
    editor.need_torch()
    return {knob: True}
