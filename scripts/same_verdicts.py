"""Whether two `difftest run` reports hold the same (backend, case, verdict) triples, in the same order,
and on which GPUs each report's results were computed. Exit status 1 when they differ.

    python3 scripts/same_verdicts.py BASELINE.json OTHER.json
"""

from __future__ import annotations

import collections
import sys

from difftest.serialize import load_results


def main(baseline: str, other: str) -> int:
    runs = {path: load_results(path) for path in (baseline, other)}
    for path, results in runs.items():
        devices = collections.Counter(r.gpu for r in results)
        print(f"{path}: {len(results)} results; computed on {dict(devices)}")
    triples = [[(r.backend, r.case, r.verdict.value) for r in results] for results in runs.values()]
    differ = [(a, b) for a, b in zip(*triples, strict=False) if a != b]
    same = not differ and len(triples[0]) == len(triples[1])
    print("verdicts: the same, case for case" if same else f"verdicts differ: {differ[:10]}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
