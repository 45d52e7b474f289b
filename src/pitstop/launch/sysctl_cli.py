"""`pitstop sysctl`: report current vs recommended; --apply / --revert with consent and a backup."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.prompt import Confirm
from rich.text import Text

from pitstop.cliutil import finish, usage_error
from pitstop.findings import Finding, Report, Severity
from pitstop.launch import sysctl as sc
from pitstop.report.html import table


def _is_live(proc_sys: str) -> bool:
    return Path(proc_sys).resolve() == Path(sc.PROC_SYS)


def _numa_nodes() -> int:
    from pitstop.host.topology import read_topology

    return len(read_topology().nodes)


def run_sysctl(
    args: argparse.Namespace,
    is_root: bool | None = None,
    runner: sc.Runner = sc.run_cmd,
    confirm: Callable[[str], bool] | None = None,
    numa_nodes: int | None = None,
) -> int:
    """The command. ``is_root``, ``runner``, ``confirm`` and ``numa_nodes`` are injectable so tests never
    touch the host."""
    if args.apply and args.revert:
        return usage_error("--apply and --revert do not go together")
    root = (os.geteuid() == 0) if is_root is None else is_root
    path = args.path or sc.DEFAULT_DROPIN
    live = _is_live(args.proc_sys)
    err = Console(stderr=True)
    report = Report(tool="sysctl", meta={"dropin": path, "proc_sys": args.proc_sys})
    if args.revert:
        try:
            values = sc.revert_dropin(path)
        except FileNotFoundError:
            return usage_error(f"no backup {sc.backup_path(path)}: nothing to revert")
        except (OSError, ValueError) as e:
            return usage_error(f"cannot revert {path}: {e}")
        report.add(_load(values, args.proc_sys, live, root, runner, revert=True, path=path))
    nodes = _numa_nodes() if numa_nodes is None else numa_nodes
    checks = sc.check_all(args.proc_sys, args.sys_root, nodes)
    if args.apply:
        todo = [c for c in checks if c.write is not None]
        if not todo:
            report.add(
                Finding("sysctl.apply", Severity.PASS, "nothing to apply", "every parameter meets its rule")
            )
        else:
            text = sc.dropin_text(checks)
            if not args.yes:
                ask = confirm or _ask_terminal
                if confirm is None and not sys.stdin.isatty():
                    return usage_error("--apply asks for confirmation: run it in a terminal or pass --yes")
                err.print(Text(f"pitstop sysctl will write {path}:\n\n{text}"))
                if not ask(f"Write {path} and load it?"):
                    return usage_error("not applied")
            try:
                bak = sc.write_dropin(path, checks)
            except PermissionError:
                return usage_error(f"cannot write {path}: permission denied; run with sudo or choose --path")
            except OSError as e:
                return usage_error(f"cannot write {path}: {e}")
            f = _load(sc.parse_dropin(Path(path).read_text()), args.proc_sys, live, root, runner, path=path)
            f.evidence = (
                f"wrote {len(todo)} parameters to {path} (backup of the previous state: {bak}); " + f.evidence
            )
            report.add(f)
            checks = sc.check_all(args.proc_sys, args.sys_root, nodes)  # show the state after loading
    report.add(*sc.to_findings(checks))
    report.sections["parameters"] = [c.to_dict() for c in checks]
    rows = [
        (c.name, c.current, c.recommended, {True: "ok", False: "change", None: "-"}[c.ok], c.reason)
        for c in checks
    ]
    blocks = [table("Kernel parameters", ["parameter", "current", "rule", "", "why"], rows)]
    return finish(report, args, blocks, passes="all" if getattr(args, "all", False) else "count")


def _ask_terminal(question: str) -> bool:
    return Confirm.ask(question, default=False)


def _load(
    values: dict[str, str],
    proc_sys: str,
    live: bool,
    root: bool,
    runner: sc.Runner,
    path: str,
    revert: bool = False,
) -> Finding:
    """Make ``values`` live: `sysctl` as root on the real kernel, direct writes to a fake tree, or say what to run."""
    fid, what = ("sysctl.revert", "restored") if revert else ("sysctl.apply", "loaded")
    if not values:
        return Finding(fid, Severity.INFO, f"{what} nothing", "no live values to change")
    if live and root:
        cmd = (
            ["sysctl", "-w", *(f"{k}={v}" for k, v in values.items())]
            if revert
            else ["sysctl", "--load", path]
        )
        try:
            r = runner(cmd)
        except OSError as e:
            return Finding(fid, Severity.ERROR, f"{cmd[0]} failed", str(e), fix_code=" ".join(cmd))
        if r.returncode != 0:
            return Finding(
                fid, Severity.ERROR, f"`{' '.join(cmd)}` failed", (r.stderr or r.stdout).strip()[:500]
            )
        return Finding(
            fid, Severity.INFO, f"{what} {len(values)} values", f"ran {' '.join(cmd)}", data=values
        )
    if live:
        cmd = (
            "sudo sysctl -w " + " ".join(f"'{k}={v}'" for k, v in values.items())
            if revert
            else f"sudo sysctl --load {path}"
        )
        return Finding(
            fid,
            Severity.WARN,
            f"not {what}: not root",
            "changing live kernel values needs root",
            data=values,
            fix="run this as root",
            fix_code=cmd,
        )
    failed = sc.load_values(values, proc_sys)
    sev = Severity.ERROR if failed else Severity.INFO
    return Finding(
        fid,
        sev,
        f"{what} {len(values) - len(failed)} values into {proc_sys}",
        f"failed: {', '.join(failed)}" if failed else f"wrote {', '.join(values)}",
        data=values,
    )
