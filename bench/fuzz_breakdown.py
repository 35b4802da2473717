"""Where a small-regime fuzz batch spends its time, step by step, in one process.

The steps a campaign takes for one batch of BATCH_CASES small cases (difftest.workflows.fuzz, difftest.engine.runner),
each timed on its own with the GPU synchronised before and after (CUDA events would hide host work):
drawing every member together (difftest.engine.plan.build_together; the row marked "before" draws them
one by one with build_case, as campaigns did until 2026-12-03), merging and validating them, the
oracle on the merged case, each backend's call on its encoded inputs (in this process: no worker
round trip), and the per-member comparison. The table says which step a faster engine has to shrink first.

    python bench/fuzz_breakdown.py --device cuda --backends torch,deepgemm --out reports/h200/fuzz-breakdown
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

import torch  # after the path: a plain checkout needs it

from difftest.backends import get_backends
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import Device, OracleKind
from difftest.engine.batch import batch_key, merge
from difftest.engine.comparison import compare_spans
from difftest.engine.plan import build_together
from difftest.generators.envelope import Target
from difftest.generators.regime import Regime
from difftest.generators.tensors import build_case
from difftest.oracles.reference import make_reference
from difftest.workflows.fuzz import BATCH_CASES, planned_cases

SMALL = Regime(max_batch=16, max_context=8192, heads=64, head_dim=128, block_size=64)


def timed(fn: Callable[[], object], device: str) -> tuple[float, object]:
    """(seconds, value) of one call, the GPU idle before and after."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    value = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, value


@contextlib.contextmanager
def _cpu_chunks() -> Iterator[None]:
    """The torch oracle's GPU chunk size set to its CPU one, as it was before the two differed."""
    module = importlib.import_module("difftest.oracles.paged_mqa_logits")  # the package exports a function of that name
    saved = module._GPU_CHUNK_ELEMENTS
    module._GPU_CHUNK_ELEMENTS = module._CHUNK_ELEMENTS
    try:
        yield
    finally:
        module._GPU_CHUNK_ELEMENTS = saved


def one_batch(backends: list, planned: list, device: str) -> dict[str, float]:
    """Seconds of each step for one batch of `planned` cases."""
    steps: dict[str, float] = {}
    steps["draw members one by one (before)"], _ = timed(
        lambda: [build_case(p.spec, p.seed, device, validate=False) for p in planned], device)
    steps["draw members together"], members = timed(lambda: build_together(planned, device), device)
    steps["merge + validate"], batch = timed(lambda: merge(members), device)
    seconds, _ = timed(batch.case.validate, device)
    steps["merge + validate"] += seconds
    steps["oracle (fast)"], ref = timed(lambda: make_reference(batch.case, OracleKind.FAST), device)
    for backend in backends:
        inputs = encode(batch.case, backend.contract)
        if backend.name == "torch" and device == "cuda":  # the baseline: the CPU's chunk size on the GPU
            with _cpu_chunks():
                steps["torch call, CPU chunks (before)"], _ = timed(lambda b=backend, i=inputs: b(i, None), device)
        steps[f"{backend.name} call"], out = timed(lambda b=backend, i=inputs: b(i, None), device)
        steps[f"{backend.name} compare"], _ = timed(
            lambda b=backend, o=out: compare_spans(ref.logits, o, ref.row_lens, b.contract, ref.bound,
                                                   batch.spans), device)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backends", default="torch,deepgemm")
    parser.add_argument("--batches", type=int, default=8, help="batches timed (each run twice)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    backends = get_backends(args.backends.split(","))
    target = Target.probe(Device(args.device))
    stream = planned_cases(backends, target, SMALL, seed=0)
    buckets: dict[object, list] = {}
    rows: list[dict[str, float]] = []  # each batch's second run: what a long campaign pays per batch
    cold: list[dict[str, float]] = []  # its first: kernels compiled for its shape (Triton, DeepGEMM's JIT)
    for planned in itertools.islice(stream, 20_000):
        bucket = buckets.setdefault((batch_key(planned.spec), planned.backends), [])
        bucket.append(planned)
        if len(bucket) == BATCH_CASES:
            takers = [b for b in backends if planned.backends is None or b.name in planned.backends]
            members = buckets.pop((batch_key(planned.spec), planned.backends))
            cold.append(one_batch(takers, members, args.device))
            rows.append(one_batch(takers, members, args.device))
            if len(rows) == args.batches:
                break
    timed_rows = rows
    steps = list(timed_rows[0])
    median = {step: statistics.median(r.get(step, 0.0) for r in timed_rows) for step in steps}
    total = sum(s for step, s in median.items() if not step.endswith("(before)"))  # the engine as it is now
    lines = [f"One batch of {BATCH_CASES} small cases ({SMALL}), {args.device}, median of {len(timed_rows)} "
             f"batches, each timed on its second run (its kernels compiled by the first, as in a long "
             f"campaign); in-process, GPU synchronised around each step. First runs: median "
             f"{1e3 * statistics.median(sum(r.values()) for r in cold):.0f} ms a batch.", "",
             "| step | ms per batch | ms per case | share |", "|---|---|---|---|"]
    for step, s in median.items():
        lines.append(f"| {step} | {1e3 * s:.1f} | {1e3 * s / BATCH_CASES:.2f} | {s / total:.0%} |")
    lines.append(f"| all (without the 'before' row) | {1e3 * total:.1f} | {1e3 * total / BATCH_CASES:.2f} | "
                 f"=> {BATCH_CASES / total:.0f} cases/s |")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fuzz_breakdown.md").write_text("\n".join(lines) + "\n")
        record = {"median_seconds": median, "batches": rows, "first_runs": cold}
        (args.out / "fuzz_breakdown.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
