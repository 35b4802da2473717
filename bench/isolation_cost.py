"""What isolation costs: cases per second of `difftest run` with every backend in-process and with each
backend in a worker process of its own (difftest.engine.isolate).

The cases are the default suite (difftest.generators.cases.suite("all"): 4 random specs x --count seeds plus
the 14 edges), drawn once before any timing on --device. Each mode runs the whole suite through
difftest.engine.runner.run, as `difftest run` does: one untimed warm-up run (it starts the fork server and
warms torch), then --repeats timed runs, median. An isolated run starts its workers afresh, so its
time includes their start (fork, import of the backend, first call) and the transfer of every
case's inputs and outputs to the worker and back; the start-up row isolates that fixed part: a
one-case run isolated minus the same case in-process, and the per-case row what is left, per case.
On a GPU the isolated mode runs once per transport (difftest.engine.isolate.transport_for): cuda-ipc (the
default: memory handles) and copy (CPU copies through the pipe, the baseline). Every mode must give
the same verdicts; the script checks.

    python bench/isolation_cost.py                      # CPU, the torch backend
    python bench/isolation_cost.py --device cuda --backends torch,deepgemm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

import torch  # after the path: a plain checkout needs it

from difftest.backends import get_backends
from difftest.core.case import Case
from difftest.engine.config import RunConfig
from difftest.engine.result import CaseResult
from difftest.engine.runner import run
from difftest.generators import build_case
from difftest.generators.cases import suite


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


def measure(backends: list, cases: list[Case], args: argparse.Namespace, transport: str | None) -> dict:
    """One mode's row: in-process when `transport` is None, else isolated over that transport."""
    if transport:
        os.environ["DIFFTEST_WORKER_TRANSPORT"] = transport  # read as each run starts its workers
    config = RunConfig(device=args.device, isolate=transport is not None)
    seconds, results = timed_runs(backends, cases, config, args.repeats)
    return {"cases": len(cases), "results": len(results), "seconds": seconds,
            "cases_per_second": len(cases) / seconds, "verdicts": verdicts(results)}


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
    transports = ("cuda-ipc", "copy") if args.device == "cuda" else ("copy",)
    rows = {label: measure(backends, chosen, args, None) for label, chosen in
            (("in-process", cases), ("in-process, 1 case", cases[:1]))}
    for transport in transports:
        rows[f"isolated, {transport}"] = measure(backends, cases, args, transport)
        rows[f"isolated, {transport}, 1 case"] = measure(backends, cases[:1], args, transport)
        changed = set(rows["in-process"]["verdicts"]) ^ set(rows[f"isolated, {transport}"]["verdicts"])
        if changed:
            raise AssertionError(f"isolation ({transport}) changed a verdict: {changed}")
    print_table(rows, transports, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "backends": args.backends, "rows": {
            k: {f: v for f, v in row.items() if f != "verdicts"} for k, row in rows.items()}}, indent=1) + "\n")
    return 0


def print_table(rows: dict[str, dict], transports: tuple[str, ...], args: argparse.Namespace) -> None:
    gpu = f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    print(f"difftest run, default suite (--count {args.count}), backends {args.backends}, {args.device}{gpu}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} after 1 warm-up")
    print(f"{'mode':<22} {'cases':>5} {'results':>7} {'seconds':>8} {'cases/s':>8}  vs in-process")
    base = rows["in-process"]
    print(f"{'in-process':<22} {base['cases']:>5} {base['results']:>7} {base['seconds']:>8.2f} "
          f"{base['cases_per_second']:>8.1f}")
    for transport in transports:
        row = rows[f"isolated, {transport}"]
        startup = rows[f"isolated, {transport}, 1 case"]["seconds"] - rows["in-process, 1 case"]["seconds"]
        per_case = (row["seconds"] - startup - base["seconds"]) / row["cases"]
        print(f"{'isolated, ' + transport:<22} {row['cases']:>5} {row['results']:>7} {row['seconds']:>8.2f} "
              f"{row['cases_per_second']:>8.1f}  {row['seconds'] / base['seconds']:.2f}x; without the worker "
              f"start-up ({startup:.2f} s, once per run): {(row['seconds'] - startup) / base['seconds']:.2f}x, "
              f"{per_case * 1e3:+.1f} ms per case")


if __name__ == "__main__":
    sys.exit(main())
