"""What isolation costs: cases per second of `difftest run` with every backend in-process and with each
backend in a worker process of its own (difftest.isolate).

The cases are the default suite (generators.cases.suite("all"): 4 random specs x --count seeds plus
the 14 edges), drawn once before any timing on --device. Each mode runs the whole suite through
difftest.runner.run, as `difftest run` does: one untimed warm-up run (it starts the fork server and
warms torch), then --repeats timed runs, median. An isolated run starts its workers afresh, so its
time includes their start (fork, import of the backend, first call) and the transfer of every
case's inputs and outputs through a pipe; the start-up row isolates that fixed part: a one-case run
isolated minus the same case in-process. Both modes must give the same verdicts; the script checks.

    python bench/isolation_cost.py                      # CPU, the torch backend
    python bench/isolation_cost.py --device cuda --backends torch,deepgemm
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

import torch  # after the path: a plain checkout needs it

from difftest.backends import get_backends
from difftest.case import Case
from difftest.runner import CaseResult, RunConfig, run
from generators import build_case
from generators.cases import suite


def timed_runs(backends: list, cases: list[Case], config: RunConfig, repeats: int) -> tuple[float, list[CaseResult]]:
    """(median seconds of `repeats` runs after one warm-up, the last run's results)."""
    results = run(backends, cases, config)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        results = run(backends, cases, config)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), results


def verdicts(results: list[CaseResult]) -> list[tuple[str, str, str]]:
    return [(r.backend, r.case, r.verdict.value) for r in results]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backends", default="torch", help="comma-separated registered names (default: torch)")
    parser.add_argument("--count", type=int, default=6, help="seeds per random spec (default: 6)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode (default: 3)")
    parser.add_argument("--json", help="write the numbers here too")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    backends = get_backends(args.backends.split(","))
    cases = [build_case(spec, seed, args.device, name=f"{spec.name}-s{seed}")
             for spec, seed in suite("all", args.count, 0)]
    rows = {}
    for label, isolate, chosen in (("in-process", False, cases), ("isolated", True, cases),
                                   ("in-process, 1 case", False, cases[:1]), ("isolated, 1 case", True, cases[:1])):
        seconds, results = timed_runs(backends, chosen, RunConfig(device=args.device, isolate=isolate), args.repeats)
        rows[label] = {"cases": len(chosen), "results": len(results), "seconds": seconds,
                       "cases_per_second": len(chosen) / seconds, "verdicts": verdicts(results)}
    if rows["in-process"]["verdicts"] != rows["isolated"]["verdicts"]:
        raise AssertionError("isolation changed a verdict: "
                             f"{set(rows['in-process']['verdicts']) ^ set(rows['isolated']['verdicts'])}")
    print_table(rows, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "backends": args.backends, "rows": {
            k: {f: v for f, v in row.items() if f != "verdicts"} for k, row in rows.items()}}, indent=1) + "\n")
    return 0


def print_table(rows: dict[str, dict], args: argparse.Namespace) -> None:
    gpu = f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    print(f"difftest run, default suite (--count {args.count}), backends {args.backends}, {args.device}{gpu}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} after 1 warm-up")
    print(f"{'mode':<22} {'cases':>5} {'results':>7} {'seconds':>8} {'cases/s':>8}")
    for label in ("in-process", "isolated"):
        row = rows[label]
        print(f"{label:<22} {row['cases']:>5} {row['results']:>7} {row['seconds']:>8.2f} "
              f"{row['cases_per_second']:>8.1f}")
    startup = rows["isolated, 1 case"]["seconds"] - rows["in-process, 1 case"]["seconds"]
    print(f"{'worker start-up':<22} {'':>5} {'':>7} {startup:>8.2f}   (one-case run, isolated minus in-process)")
    ratio = rows["isolated"]["seconds"] / rows["in-process"]["seconds"]
    print(f"slowdown (isolated / in-process): {ratio:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
