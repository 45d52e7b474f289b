"""Gather benchmarks/results/*.md into benchmarks/RESULTS.md (each script writes its own results file)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADER = """# Benchmark results

Every figure below was measured by the script named in its section, on the machine it names, with
configurations interleaved in one run. Re-run a script to refresh its section, then
`python benchmarks/assemble_results.py`. No figure here is a constant: where a row could not run on
that machine, the section says why.

"""


def main() -> int:
    parts = sorted((HERE / "results").glob("*.md"))
    if not parts:
        print("no results in benchmarks/results/", file=sys.stderr)
        return 1
    toc = "".join(f"- [{p.stem}](results/{p.name})\n" for p in parts)
    body = "\n\n".join(p.read_text().strip() for p in parts)
    (HERE / "RESULTS.md").write_text(f"{HEADER}## Contents\n{toc}\n{body}\n")
    print(f"wrote {HERE / 'RESULTS.md'} from {len(parts)} result files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
