"""Forward timing and model discovery through global module hooks
(``torch.nn.modules.module.register_module_forward_pre_hook`` / ``register_module_forward_hook``).

A call of a module with parameters that no other module call encloses is a top-level forward: it is
timed, and the module becomes one of the script's models the first time (unless it is part of a model
already known). Nothing is registered on the modules themselves, so the script's models pickle, deepcopy,
``torch.save``, ``torch.jit.script`` and ``torch.export`` as without pitstop. Under ``torch.compile`` /
``torch.export`` tracing the hooks return at once (``torch.compiler.is_compiling()``, a constant there),
so they add no graph break; a compiled model's call is timed from its ``OptimizedModule``.

While any global forward hook exists, torch sends every module call through its slower hooked path (about
2.5 us a call over its fast path, plus the hooks): a cost per module call, which grows with the model
(hundreds of calls a step in a transformer). So once the warm-up is over, where the warm-up's timed
forwards were all calls ``model(x)`` of the models found (no ``model.forward(x)``, no part of a model
called on its own, no input override), the hooks go and those forwards are timed from their classes'
``__call__`` (patched on the class, like the DataLoader's methods, never on the object): one wrapper call
per model call, and one cheap pass-through for other instances of those classes.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.nn.modules import module as _module

from pitstop.profile.capture import direct_forward
from pitstop.profile.capture.where import user_location
from pitstop.recipes import autocast, components, enabled, model_components
from pitstop.recipes.component import DTYPE, PROCESS, WRAP

if TYPE_CHECKING:
    from pitstop.profile.capture.patches import Patches
    from pitstop.profile.capture.points import ProbePoints
    from pitstop.recipes.component import DtypeComponent, ProcessComponent, WrapComponent

is_compiling = torch.compiler.is_compiling
clock = time.perf_counter
NARROW_AFTER = 2  # whole steps the global hooks see, besides the warm-up, before they may go


class ModelHooks:
    """The global forward hooks and the models they found."""

    def __init__(self, inst: ProbePoints) -> None:
        self.inst = inst
        self.depth = 0  # module calls open now
        self.model_ids: set[int] = set()
        self.part_ids: set[int] = set()  # every module inside a known model
        self.pending: set[int] = set()  # lazy models waiting for their first forward (model components)
        self.autocast_ctx: list[Any] = []
        self.handles: list[Any] = []
        self.top: list[torch.nn.Module] = []  # the top-level forward in progress (one, or none)
        self.top_types: set[type] = set()  # classes of the modules whose forwards were timed
        self.parts_alone = False  # a part of a model was called outside its model's forward
        self.narrowed = False  # narrow() has decided
        self.wrapped = False  # the models' classes' __call__ time the forwards now
        # forwards called as model.forward(x) (pitstop.profile.capture.direct_forward)
        self.direct_ids: set[int] = set()  # models seen called that way
        self.direct_parts: set[int] = set()  # their modules
        self.direct_model: torch.nn.Module | None = None  # the one whose forward is open now
        self.direct_frame: Any = None  # its forward's frame
        self.direct_end = 0.0  # when the last submodule call inside it ended
        ov = inst.cfg.overrides
        self.injected = enabled(ov)  # the components (channels_last, ...) the overrides turn on
        # the dtype components (float32) the overrides turn on: model, inputs and outputs converted
        dtype = cast("list[DtypeComponent]", components(DTYPE))
        self.dtype = [c for c in dtype if getattr(ov, c.KNOB, False)]
        wraps = cast("list[WrapComponent]", components(WRAP))  # compile: each model found, in place
        self.wraps = [c for c in wraps if getattr(ov, c.KNOB, False)]
        self.on_inputs = bool(self.injected or ov.autocast or self.dtype)  # override_inputs has work
        # override_output has work: while an autocast context is open (the list), always under a dtype one
        self.on_outputs: list[Any] | bool = True if self.dtype else self.autocast_ctx

    def install(self, patches: Patches) -> None:
        for comp in self.wraps:
            comp.install(patches)
        self.handles = [
            _module.register_module_forward_pre_hook(self.pre),
            _module.register_module_forward_hook(self.post, with_kwargs=True, always_call=True),
        ]
        ours = {h.id for h in self.handles}
        orig = _module._has_any_global_hook

        def _has_any_global_hook() -> bool:
            # torch.compile(module) warns when global hooks exist; pitstop's own must not change that
            tables = (
                _module._global_backward_pre_hooks,
                _module._global_backward_hooks,
                _module._global_forward_pre_hooks,
                _module._global_forward_hooks,
            )
            return any(k not in ours for t in tables for k in t)

        _has_any_global_hook.__wrapped__ = orig  # type: ignore[attr-defined]
        patches.patch(_module, "_has_any_global_hook", _has_any_global_hook)

    def uninstall(self, keep_handles: bool = False) -> None:
        """Remove the hooks (``keep_handles``: they stay registered, for a later ``uninstall``)."""
        self.wrapped = False
        for h in [] if keep_handles else self.handles:
            h.remove()
            # RemovableHandle does not clear the with_kwargs table of global forward hooks
            _module._global_forward_hooks_with_kwargs.pop(h.id, None)
        if not keep_handles:
            self.handles = []
        while self.autocast_ctx:
            with contextlib.suppress(Exception):
                self.autocast_ctx.pop().__exit__(None, None, None)

    def pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> Any:
        if is_compiling():
            return None
        depth = self.depth
        self.depth = depth + 1
        if depth or not self._timed(module):
            return None
        self.top.append(module)
        return self.inst.forward_begin(module, args)

    def _timed(self, module: torch.nn.Module) -> bool:
        """Whether a call no other module call encloses is a forward to time: of a model (one found now,
        if new), not under tracing, data loading or backward."""
        inst = self.inst
        # module calls inside data loading or backward (checkpoint recomputation) are not forwards;
        # torch.jit.is_tracing() less its is_scripting() check (this is never scripted, nor compiled)
        if inst.in_next or inst.in_backward or torch._C._is_tracing():
            return False
        if id(module) not in self.model_ids:
            if id(module) in self.part_ids:
                self.parts_alone = True
                caller = sys._getframe(3)
                # a part of a model called directly, or of one called model(x) so far, called inside a forward
                if id(module) in self.direct_parts or direct_forward.near_forward(caller):
                    self._direct_call(caller)
                return False
            if next(module.parameters(), None) is None:
                return False
            inner = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule of a known model
            if isinstance(inner, torch.nn.Module) and id(inner) in self.model_ids:
                self.model_ids.add(id(module))
            elif self._direct_call(sys._getframe(3)):
                return False  # a submodule of a model called as model.forward(x): timed as that model
            else:
                self.add_model(module)
        if self.direct_model is not None:
            self.end_direct()
        self.top_types.add(type(module))
        return True

    def _direct_call(self, caller: Any) -> bool:
        """A module call no other module call encloses, made from ``caller`` (a frame): where it runs
        inside the ``forward`` of a model called directly, that forward is open (opened now, if it was
        not). Whether it is."""
        if self.direct_model is not None:
            if direct_forward.on_stack(self.direct_frame, caller):
                return True
            self.end_direct()  # the forward open so far has returned
        found = direct_forward.outermost_forward(caller)
        if found is None:
            return False
        model, frame = found
        inst = self.inst
        if id(model) not in self.direct_ids:
            self.direct_ids.add(id(model))
            self.direct_parts.update(id(m) for m in model.modules())
            if id(model) not in self.model_ids:
                self.add_model(model)
        inputs = direct_forward.frame_inputs(frame)
        inst.forward_begin(model, inputs[0] if inputs else ())
        self.direct_model, self.direct_frame = model, frame
        self.direct_end = clock()
        if inputs is not None and torch.is_grad_enabled():
            inst.captured.last_inputs = inputs
        return True

    def end_direct(self) -> None:
        """The direct forward open ends where its last submodule call ended (or where the phases last
        changed, if later)."""
        model, self.direct_model, self.direct_frame = self.direct_model, None, None
        if model is not None:
            self.inst.forward_end(model, None, max(self.direct_end, self.inst.clock.phases.mark))

    def post(self, module: torch.nn.Module, args: Any, *rest: Any) -> Any:
        # (args, kwargs, output) after a forward; (args, output) when forward raised (always_call)
        if is_compiling():
            return None
        depth = self.depth - 1
        if depth > 0:  # a nested call: the common case, kept short
            self.depth = depth
            return None
        self.depth = 0
        top = self.top
        if not top or top[-1] is not module:
            if self.direct_model is not None:
                self.direct_end = clock()
            return None
        top.pop()
        if len(rest) == 2 and torch.is_grad_enabled():
            self.inst.captured.last_inputs = (args, rest[0])
        return self.inst.forward_end(module, rest[-1])

    def narrow(self, patches: Patches) -> None:
        """After the warm-up, outside any module call: where every timed forward was a call ``model(x)``
        of a model found and nothing changes a forward's inputs or outputs, time them from their classes'
        ``__call__`` and remove the global hooks. Decided once."""
        self.narrowed = True
        if (
            not (self.model_ids and self.top_types)
            or self.depth
            or self.top
            or self.on_inputs
            or self.on_outputs is True
            or self.pending
            or self.direct_ids
            or self.parts_alone
        ):
            return
        self.uninstall()
        for cls in self.top_types:
            patches.patch(cls, "__call__", self._timed_call(cls.__call__))
        self.wrapped = True

    def _timed_call(self, orig: Any) -> Any:
        hooks, inst, ids = self, self.inst, self.model_ids
        is_tracing = torch._C._is_tracing

        @functools.wraps(orig)
        def __call__(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            # another instance of the class, a nested call, tracing, data loading or recomputation
            if (
                is_compiling()  # first: a constant under tracing, so no guard on what follows
                or hooks.depth
                or id(module) not in ids
                or inst.in_next
                or inst.in_backward
                or is_tracing()
            ):
                return orig(module, *args, **kwargs)
            inst.forward_begin(module, args)
            hooks.depth = 1
            try:
                out = orig(module, *args, **kwargs)
            except BaseException:
                hooks.depth = 0
                if hooks.wrapped:
                    inst.forward_end(module, None)
                raise
            hooks.depth = 0
            if not hooks.wrapped:  # measuring stopped inside this forward (detach): as the inert hooks
                return out
            if torch.is_grad_enabled():
                inst.captured.last_inputs = (args, kwargs)
            inst.forward_end(module, out)
            return out

        return __call__

    def add_model(self, module: torch.nn.Module) -> None:
        inst = self.inst
        self.model_ids.add(id(module))
        self.part_ids.update(id(m) for m in module.modules())
        inst.captured.models.append(module)
        inst.model_facts[id(module)] = {"first_location": user_location(4)}
        ov = inst.cfg.overrides
        for comp in cast("list[ProcessComponent]", components(PROCESS)):  # tf32, cudnn_benchmark, threads
            setting = getattr(ov, comp.KNOB, None)
            if setting and not getattr(comp, "AT_START", False):  # the knob's value (threads: at start)
                comp.apply(module_device_type(module), setting)
        if self.injected:
            self.apply_components(module)
        if id(module) not in self.direct_ids:  # model.forward(x): its inputs cannot be converted
            for dt in self.dtype:  # float32
                dt.apply_model(module)
        for wrap in self.wraps:  # compile: stays eager where its setup fails, and says so
            failed = wrap.inject(module)
            if failed is not None:
                inst.compile_error = failed

    # ---------------------------------------------------------------------------- overrides
    def apply_components(self, module: torch.nn.Module) -> None:
        """The injected components' model change; a model one cannot change yet (lazy layers) waits for
        the forward that creates them."""
        for comp in self.injected:
            if not comp.ready(module):
                self.pending.add(id(module))
                return
        self.pending.discard(id(module))
        for comp in self.injected:
            try:
                comp.apply_model(module)
            except Exception as e:
                self.inst.override_errors.append(f"{comp.NAME}: {type(e).__name__}: {e}")

    def override_inputs(self, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """Apply the input overrides (the components', e.g. channels_last and float32; autocast) at a top-level
        forward; new args or None. Not for a model called as ``model.forward(x)``: its arguments are bound
        already."""
        if id(module) in self.direct_ids:
            return None
        ov = self.inst.cfg.overrides
        new = None
        for comp in self.injected:
            new = comp.apply_input(args if new is None else new)
            kwargs = call_kwargs()
            for k, v in list(kwargs.items()):
                kwargs[k] = comp.apply_input(v)
        if ov.autocast:
            ctx = autocast.context(module_device_type(module), ov.autocast)
            ctx.__enter__()
            self.autocast_ctx.append(ctx)
        for dt in self.dtype:  # float32
            new = dt.apply_input(args if new is None else new)
            kwargs = call_kwargs()
            kwargs.update(dt.apply_input(kwargs))
        return new

    def override_output(self, module: torch.nn.Module, output: Any) -> Any:
        if self.pending and id(module) in self.pending:
            self.apply_components(module)
        if id(module) in self.direct_ids:
            return None
        new = None
        if self.autocast_ctx:
            self.autocast_ctx.pop().__exit__(None, None, None)
            new = _float_outputs(output)
        for dt in self.dtype:  # float32: what follows sees the dtype the script made
            new = dt.apply_output(output if new is None else new)
        return new


def call_kwargs() -> dict[str, Any]:
    """The keyword arguments of the ``Module._call_impl`` running the hook (global pre-hooks get only the
    positional ones); the dict is the call's own, so changing it changes what forward receives."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_name != "_call_impl":
        f = f.f_back
    kwargs = f.f_locals.get("kwargs") if f is not None else None
    return kwargs if isinstance(kwargs, dict) else {}


def module_device_type(module: torch.nn.Module) -> str:
    p = next(module.parameters(), None)
    return p.device.type if p is not None else "cpu"


def _float_outputs(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype in (torch.bfloat16, torch.float16) else out
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(_float_outputs(o) for o in out)
    if isinstance(out, list):
        return [_float_outputs(o) for o in out]
    return out


def _tensors(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 3:
        return []
    if isinstance(obj, list | tuple):
        return [t for o in obj for t in _tensors(o, depth + 1)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o, depth + 1)]
    return []


def forward_facts(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    dev = module_device_type(module)
    inputs = _tensors((args, kwargs))
    autocast = torch.is_autocast_enabled(dev)
    return {
        "autocast": autocast,
        "autocast_dtype": str(torch.get_autocast_dtype(dev)).replace("torch.", "") if autocast else None,
        "input_shapes": [list(t.shape) for t in inputs[:4]],
        "input_dtypes": sorted({str(t.dtype).replace("torch.", "") for t in inputs}),
        **{k: v for c in model_components() for k, v in c.input_facts(inputs).items()},
    }
