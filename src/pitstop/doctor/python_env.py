"""Python environment probes: interpreter, virtualenv/conda, torch/torchvision pairing, debug builds and
debug switches that slow everything down."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from pitstop.doctor.torchinfo import TorchBuild
from pitstop.doctor.wheels import local_tag, parse_version
from pitstop.findings import Finding, Severity


@dataclass(frozen=True)
class PythonFacts:
    version: tuple[int, int, int]
    implementation: str
    executable: str
    prefix: str
    base_prefix: str
    debug_build: bool  # a --with-pydebug interpreter
    dev_mode: bool
    optimize: int
    gil_disabled: bool


def read_python() -> PythonFacts:
    gil = getattr(sys, "_is_gil_enabled", None)
    return PythonFacts(
        version=tuple(sys.version_info[:3]),  # type: ignore[arg-type]
        implementation=sys.implementation.name,
        executable=sys.executable,
        prefix=sys.prefix,
        base_prefix=sys.base_prefix,
        debug_build=hasattr(sys, "gettotalrefcount"),
        dev_mode=bool(sys.flags.dev_mode),
        optimize=sys.flags.optimize,
        gil_disabled=bool(gil is not None and not gil()),
    )


def check_version(py: PythonFacts) -> list[Finding]:
    v = ".".join(map(str, py.version))
    data = {"version": v, "implementation": py.implementation, "executable": py.executable}
    ev = f"{py.implementation} {v} at {py.executable}" + (
        " (free-threaded, GIL off)" if py.gil_disabled else ""
    )
    if py.implementation != "cpython":
        return [
            Finding("python.version", Severity.WARN, f"{py.implementation} interpreter", ev, data,
                    fix="torch supports CPython only; use a CPython 3.11+ interpreter.")
        ]  # fmt: skip
    if py.version[:2] < (3, 10):
        return [
            Finding("python.version", Severity.WARN, f"Python {v} is old", ev, data,
                    fix="Use Python 3.11+ (current torch releases dropped older versions; 3.11 runs Python code faster).")
        ]  # fmt: skip
    return [Finding("python.version", Severity.PASS, f"Python {v}", ev, data)]


def check_environment(py: PythonFacts, env: Mapping[str, str]) -> list[Finding]:
    venv = py.prefix != py.base_prefix
    conda = env.get("CONDA_PREFIX") or (
        py.prefix if os.path.isdir(os.path.join(py.prefix, "conda-meta")) else None
    )
    kind = "conda" if conda else ("virtualenv" if venv else "system interpreter")
    data = {"kind": kind, "prefix": py.prefix, "base_prefix": py.base_prefix, "conda_prefix": conda}
    ev = f"sys.prefix={py.prefix}, sys.base_prefix={py.base_prefix}" + (
        f", CONDA_PREFIX={conda}" if conda else ""
    )
    if kind == "system interpreter":
        return [
            Finding(
                "python.environment",
                Severity.INFO,
                "torch installed into the system Python",
                ev,
                data,
                fix="Use a virtualenv so the torch build and its CUDA libraries can be changed without touching "
                "the OS Python.",
                fix_code="python3 -m venv .venv && . .venv/bin/activate",
            )
        ]
    return [Finding("python.environment", Severity.PASS, f"Isolated environment ({kind})", ev, data)]


def expected_torchvision(torch_version: str) -> tuple[int, int] | None:
    """torch 2.x pairs with torchvision 0.(x+15): 2.5 -> 0.20, 2.14 -> 0.29 (the rule since torch 2.0)."""
    v = parse_version(torch_version)
    if not v or len(v) < 2 or v[0] != 2:
        return None
    return (0, v[1] + 15)


def check_torchvision(build: TorchBuild) -> list[Finding]:
    tv = build.torchvision_version
    data = {"torch": build.version, "torchvision": tv}
    if tv is None:
        return [
            Finding(
                "python.torchvision",
                Severity.INFO,
                "torchvision not installed",
                f"torch {build.version}; no torchvision distribution found",
                data,
                fix="Only needed for vision datasets and transforms.",
            )
        ]
    want = expected_torchvision(build.version)
    got = parse_version(tv)
    t_tag, v_tag = local_tag(build.version), local_tag(tv)
    problems = []
    if want and got and got[:2] != want:
        problems.append(f"torch {build.version} pairs with torchvision {want[0]}.{want[1]}.x, found {tv}")
    if t_tag and v_tag and t_tag != v_tag:
        problems.append(f"build tags differ ({t_tag} vs {v_tag}): torchvision's C++ ops will fail to load")
    ev = f"torch {build.version}, torchvision {tv}" + (
        f"; expected torchvision {want[0]}.{want[1]}.x" if want else ""
    )
    if problems:
        return [
            Finding(
                "python.torchvision",
                Severity.ERROR,
                "torch and torchvision do not match",
                "; ".join(problems),
                data,
                fix="Install the pair from the same index in one command.",
                fix_code=f"pip install torch=={build.version.split('+')[0]} torchvision=={want[0]}.{want[1]}.*"
                if want
                else None,
            )
        ]
    return [Finding("python.torchvision", Severity.PASS, f"torchvision {tv} matches torch", ev, data)]


def check_debug(py: PythonFacts, build: TorchBuild, env: Mapping[str, str]) -> list[Finding]:
    """Debug builds and debug switches: each makes training several times slower."""
    problems = []
    if build.debug or (build.build_type or "").lower() == "debug":
        problems.append(
            f"torch is a debug build (torch.version.debug={build.debug}, BUILD_TYPE={build.build_type})"
        )
    if py.debug_build:
        problems.append("Python is a debug (--with-pydebug) build")
    if py.dev_mode or env.get("PYTHONDEVMODE"):
        problems.append("Python development mode is on (-X dev / PYTHONDEVMODE)")
    if env.get("PYTHONMALLOC", "").startswith(("debug", "malloc_debug")):
        problems.append(f"PYTHONMALLOC={env['PYTHONMALLOC']}")
    if env.get("PYTHONTRACEMALLOC"):
        problems.append(f"PYTHONTRACEMALLOC={env['PYTHONTRACEMALLOC']} (traces every allocation)")
    if env.get("TORCH_SHOW_CPP_STACKTRACES") == "1" or env.get("TORCH_CPP_LOG_LEVEL", "").upper() == "INFO":
        problems.append("torch C++ debug logging/stacktraces on")
    data = {
        "torch_debug": build.debug,
        "build_type": build.build_type,
        "python_debug": py.debug_build,
        "dev_mode": py.dev_mode,
        "problems": problems,
    }
    if problems:
        return [
            Finding(
                "python.debug",
                Severity.ERROR if build.debug or py.debug_build else Severity.WARN,
                "Debug build or debug mode: everything runs slower",
                "; ".join(problems),
                data,
                fix="Use release builds (the official wheels) and unset the debug variables for training.",
            )
        ]
    return [
        Finding(
            "python.debug",
            Severity.PASS,
            "Release builds, no debug switches",
            f"torch BUILD_TYPE={build.build_type}, torch.version.debug={build.debug}; Python release build; "
            "no -X dev, PYTHONMALLOC, PYTHONTRACEMALLOC",
            data,
        )
    ]
