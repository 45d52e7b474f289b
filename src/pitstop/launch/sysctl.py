"""Kernel parameters that matter for training: read, compare with a recommendation, write a drop-in.

Pure functions over a ``/proc/sys`` root (tests use a fake tree). Nothing here changes the live kernel
except ``load_values`` / ``run_sysctl_load``, which the CLI calls only after --apply and confirmation.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.host.memory import read_meminfo, thp_mode
from pitstop.host.sysfs import PROC_SYS, read_sysctl, sysctl_path
from pitstop.units import MiB

DEFAULT_DROPIN = "/etc/sysctl.d/90-pitstop.conf"
THP_DIR = "/sys/kernel/mm/transparent_hugepage"
THP = "transparent_hugepage"
_64M = 64 * MiB
_MULTI_NODE = "; matters only for multi-node jobs over TCP (not InfiniBand)"
NO_SWAP = "no swap: does not matter here"


@dataclass(frozen=True)
class Param:
    """One parameter and its rule. ``rule``: at_least / at_most / equal, or tcp_max (the third field of a
    ``min default max`` triple must be at least the value)."""

    name: str
    rule: str
    value: int
    reason: str
    multi_numa_only: bool = False
    off: Severity = Severity.WARN  # the verdict when the rule is not met (``verdict``)


PARAMS: tuple[Param, ...] = (
    Param("fs.file-max", "at_least", 2_097_152,
          "system-wide open-file limit; DataLoader workers share tensors through file descriptors and "
          "large jobs run out ('Too many open files')"),
    Param("fs.nr_open", "at_least", 1_048_576,
          "ceiling for a process's `ulimit -n`; many workers x open shards need more than the default"),
    Param("net.core.rmem_max", "at_least", _64M,
          "largest socket receive buffer; caps TCP autotuning for NCCL/Gloo socket traffic between nodes"
          + _MULTI_NODE, off=Severity.INFO),
    Param("net.core.wmem_max", "at_least", _64M,
          "largest socket send buffer; caps TCP autotuning for NCCL/Gloo socket traffic between nodes"
          + _MULTI_NODE, off=Severity.INFO),
    Param("net.ipv4.tcp_rmem", "tcp_max", _64M,
          "TCP receive buffer autotuning range (min default max); the max bounds one stream's throughput "
          "on fast links" + _MULTI_NODE, off=Severity.INFO),
    Param("net.ipv4.tcp_wmem", "tcp_max", _64M,
          "TCP send buffer autotuning range (min default max); the max bounds one stream's throughput"
          + _MULTI_NODE, off=Severity.INFO),
    Param("vm.swappiness", "at_most", 10,
          "how eagerly the kernel swaps process memory instead of dropping page cache; swapping a "
          "training process stalls its steps"),
    Param("vm.max_map_count", "at_least", 262_144,
          "memory mappings per process; memory-mapped datasets (numpy memmap, Arrow, safetensors) and "
          "many threads exceed the default 65530 ('mmap failed: Cannot allocate memory')"),
    Param("kernel.numa_balancing", "equal", 0,
          "automatic NUMA balancing unmaps and migrates pages to follow accesses; with processes bound "
          "to their node (pitstop launch) it only adds page faults", multi_numa_only=True),
)  # fmt: skip


@dataclass
class Check:
    name: str
    current: str | None
    recommended: str  # what to write (or the rule, in words, when nothing is to be written)
    ok: bool | None  # None: could not be read, or does not apply here
    reason: str
    write: str | None  # value for the drop-in when not ok
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rule_text(p: Param) -> str:
    return {
        "at_least": f">= {p.value}",
        "at_most": f"<= {p.value}",
        "equal": f"= {p.value}",
        "tcp_max": f"max >= {p.value}",
    }[p.rule]


def assess(param: Param, current: str | None, numa_nodes: int = 1, swap_bytes: int | None = None) -> Check:
    """One parameter against its rule. ``swap_bytes`` 0 (no swap) makes vm.swappiness moot."""
    rule = _rule_text(param)
    if param.multi_numa_only and numa_nodes < 2:
        return Check(
            param.name, current, rule, True, param.reason, None, "single NUMA node: does not matter here"
        )
    if param.name == "vm.swappiness" and swap_bytes == 0:
        return Check(param.name, current, rule, True, param.reason, None, NO_SWAP)
    if current is None:
        return Check(param.name, None, rule, None, param.reason, None, "not readable here")
    try:
        fields = [int(x) for x in current.split()]
    except ValueError:
        return Check(param.name, current, rule, None, param.reason, None, "unexpected value")
    if param.rule == "tcp_max":
        if len(fields) != 3:
            return Check(param.name, current, rule, None, param.reason, None, "expected 'min default max'")
        ok = fields[2] >= param.value
        write = f"{fields[0]} {fields[1]} {param.value}"
    else:
        v = fields[0]
        ok = {"at_least": v >= param.value, "at_most": v <= param.value, "equal": v == param.value}[
            param.rule
        ]
        write = str(param.value)
    return Check(param.name, current, rule, ok, param.reason, None if ok else write)


def param(name: str) -> Param:
    return next(p for p in PARAMS if p.name == name)


def verdict(c: Check) -> Severity:
    """The one verdict of a check, wherever it is shown (``pitstop sysctl``, ``pitstop doctor``): PASS when
    the rule holds (or does not apply here), the parameter's ``off`` severity when not, INFO unread."""
    if c.ok is None:
        return Severity.INFO
    if c.ok:
        return Severity.PASS
    return Severity.INFO if c.name == THP else param(c.name).off


def swap_total(proc_sys: str | os.PathLike[str] = PROC_SYS) -> int | None:
    """SwapTotal in bytes from the meminfo beside ``proc_sys`` (None where unreadable)."""
    return read_meminfo(Path(proc_sys).parent / "meminfo").get("SwapTotal")


def check_all(
    proc_sys: str | os.PathLike[str] = PROC_SYS,
    sys_root: str | os.PathLike[str] = "/sys",
    numa_nodes: int = 1,
) -> list[Check]:
    swap = swap_total(proc_sys)
    checks = [assess(p, read_sysctl(p.name, proc_sys), numa_nodes, swap) for p in PARAMS]
    checks.append(thp_check(sys_root))
    return checks


def thp_check(sys_root: str | os.PathLike[str] = "/sys") -> Check:
    """Transparent huge pages: not a sysctl (a drop-in cannot set it), judged beside them. Off is INFO:
    an allocation speed-up torch asks for, not a fault."""
    mode = thp_mode(sys_root)
    return Check(
        THP,
        mode,
        "always or madvise",
        None if mode is None else mode in ("always", "madvise"),
        "huge pages for large tensor buffers cut TLB misses; 'never' denies them even to code that "
        "asks with madvise (PyTorch's CPU allocator does with THP_MEM_ALLOC_ENABLE=1)",
        None,  # not a sysctl: a drop-in cannot set it
        "" if mode is not None else "not readable here",
    )


def to_findings(checks: Sequence[Check]) -> list[Finding]:
    out = []
    for c in checks:
        fid = "sysctl.thp" if c.name == THP else f"sysctl.{c.name}"
        cur = "unreadable" if c.current is None else c.current
        sev = verdict(c)
        if c.ok is None:
            title = f"{c.name}: not checked"
        elif c.ok:
            title = f"{c.name} = {cur}"
        else:
            title = f"{c.name} = {cur}, recommended {c.recommended}"
        fix, code = "", None
        if c.ok is False and c.write is not None:
            fix = "pitstop sysctl --apply writes it to a sysctl.d drop-in (asks first, keeps a backup)"
            code = f"sysctl -w {c.name}='{c.write}'"
        elif c.ok is False and c.name == THP:
            fix = (
                "set at runtime (lost at reboot; add transparent_hugepage=madvise to the kernel command line)"
            )
            code = f"echo madvise | sudo tee {THP_DIR}/enabled"
        note = f" ({c.note})" if c.note else ""
        out.append(
            Finding(
                id=fid,
                severity=sev,
                title=title,
                evidence=f"read {cur}; rule {c.recommended}: {c.reason}{note}",
                data={"current": c.current, "recommended": c.recommended, "write": c.write, "ok": c.ok},
                fix=fix,
                fix_code=code,
            )
        )
    return out


# ------------------------------------------------------------------ the drop-in, its backup, loading
def dropin_text(checks: Sequence[Check], now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.UTC)
    lines = [
        f"# Written by `pitstop sysctl --apply` on {now.isoformat(timespec='seconds')}.",
        "# Undo with `pitstop sysctl --revert` (restores the previous file and values).",
    ]
    for c in checks:
        if c.write is not None:
            lines += [f"# {c.reason} (was {c.current})", f"{c.name} = {c.write}"]
    return "\n".join(lines) + "\n"


def backup_path(dropin: str | os.PathLike[str]) -> Path:
    return Path(f"{dropin}.pitstop-backup.json")


def write_dropin(dropin: str | os.PathLike[str], checks: Sequence[Check]) -> Path:
    """Record the previous state (file and live values) once, then write the drop-in atomically."""
    path = Path(dropin)
    bak = backup_path(path)
    if not bak.exists():  # keep the state before the first apply, so --revert goes back to it
        prev = path.read_text() if path.exists() else None
        state = {
            "dropin": str(path),
            "existed": prev is not None,
            "content": prev,
            "values": {c.name: c.current for c in checks if c.write is not None and c.current is not None},
        }
        _atomic_write(bak, json.dumps(state, indent=2) + "\n")
    _atomic_write(path, dropin_text(checks))
    return bak


def revert_dropin(dropin: str | os.PathLike[str]) -> dict[str, str]:
    """Put the drop-in back as it was (or remove it) and return the live values to restore.

    Raises FileNotFoundError when there is no backup to revert to."""
    path = Path(dropin)
    bak = backup_path(path)
    state = json.loads(bak.read_text())
    if state.get("existed"):
        _atomic_write(path, state.get("content") or "")
    elif path.exists():
        path.unlink()
    bak.unlink()
    return {str(k): str(v) for k, v in state.get("values", {}).items()}


def load_values(values: dict[str, str], proc_sys: str | os.PathLike[str]) -> list[str]:
    """Write values into a /proc/sys tree (what `sysctl -w` does). Returns the names that failed."""
    failed = []
    for name, value in values.items():
        try:
            sysctl_path(name, proc_sys).write_text(value + "\n")
        except OSError:
            failed.append(name)
    return failed


def parse_dropin(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def run_cmd(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
