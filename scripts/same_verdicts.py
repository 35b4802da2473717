"""Whether two difftest JSON reports (from `difftest run --report` or `pytest --difftest-report`)
hold the same results: (backend, case, verdict, rows, and the rows of each failure kind), whatever
their order (a pytest-xdist run reports them as its workers finish), and the same per-backend summary
counts; and on which GPUs each report's results were computed. Reads the JSON itself, so reports of
different difftest versions compare. Exit status 1 when they differ.

    python3 scripts/same_verdicts.py BASELINE.json OTHER.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

ROW_KINDS = ("mask_rows", "nan_rows", "unwritten_rows", "value_rows")
SUMMARY = ("backend", "cases", "skipped", "rows", "mask_rows", "verdict", "counts")


def _result(r: dict) -> tuple:
    compared = r.get("comparison") or {}
    return (r["backend"], r["case"], r["verdict"], r["rows"], *(tuple(compared.get(k, ())) for k in ROW_KINDS))


def main(baseline: str, other: str) -> int:
    docs = {path: json.load(open(path)) for path in (baseline, other)}
    for path, doc in docs.items():
        devices = collections.Counter(r.get("gpu") for r in doc["results"])
        print(f"{path}: {len(doc['results'])} results; computed on {dict(devices)}")
    results = [sorted(_result(r) for r in doc["results"]) for doc in docs.values()]
    summaries = [sorted(tuple(str(s[k]) for k in SUMMARY) for s in doc["summaries"]) for doc in docs.values()]
    differ = [(a, b) for a, b in zip(*results, strict=False) if a != b]
    same = not differ and len(results[0]) == len(results[1])
    print("results: the same, case for case (verdict, rows, mask/NaN/unwritten/value rows)" if same
          else f"results differ: {differ[:5]}")
    same_summaries = summaries[0] == summaries[1]
    print("summaries: the same counts per backend" if same_summaries else f"summaries differ: {summaries}")
    return 0 if same and same_summaries else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="exit status 0 when they hold the same results and counts, 1 when not")
    parser.add_argument("baseline", help="a JSON report (difftest run --report, pytest --difftest-report)")
    parser.add_argument("other", help="the JSON report to compare with it")
    args = parser.parse_args()
    sys.exit(main(args.baseline, args.other))
