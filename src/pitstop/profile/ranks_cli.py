"""``pitstop profile merge DIR``: one report from the rank folders every node of a launch wrote to DIR."""

from __future__ import annotations

import argparse
from pathlib import Path

from pitstop.cliutil import finish, shows_tables, usage_error


def cmd_merge(args: argparse.Namespace, rest: list[str]) -> int:
    from rich.console import Console

    from pitstop.profile.present.render import html_blocks, print_breakdown
    from pitstop.profile.present.render_ranks import print_ranks
    from pitstop.profile.runs.merge import merge_dir, rank_dirs

    if len(rest) != 1:
        return usage_error("usage: pitstop profile merge DIR (the --out-dir every node wrote to)")
    out = Path(rest[0])
    if not rank_dirs(out):
        return usage_error(
            f"no rank-N folders in {out}: give the --out-dir the nodes' `pitstop profile` wrote to"
        )
    result = merge_dir(out)
    report = result.report()
    if shows_tables(args):
        print_breakdown(report, Console())
        print_ranks(report, Console())
    code = finish(report, args, html_blocks(report))
    return code if result.ok else 1
