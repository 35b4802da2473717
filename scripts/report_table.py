"""The backend table and the failure lines of a report or result stream that difftest wrote, as `difftest run`
prints them: for a campaign whose own printout was lost (cut off by a device call's time limit), from the
report it kept (marked incomplete) or its stream. From the project root:

    python3 scripts/report_table.py REPORT.json|STREAM.jsonl [--failures N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from difftest.records.report import render_failures, render_table, summarize
from difftest.records.serialize import load_results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--failures", type=int, default=20, help="failure blocks shown (default 20)")
    args = parser.parse_args()
    results = load_results(args.path)
    print(f"{len(results)} results from {args.path.name}\n")
    print(render_table(summarize(results)))
    print(render_failures(results, limit=args.failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
