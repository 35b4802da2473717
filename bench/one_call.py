"""What one small case costs the engine, step by step, and what isolating its backend call adds.

The steps a campaign pays for every case it runs alone (a failing batch member's re-run is one):
validating the case, drawing it, the oracle, encoding the backend's inputs (and the engine's private
copies of them), the backend's call and the comparison, each the median of --repeats on one small
case. The call is timed three ways: in this process (the baseline), in the backend's worker process
one call at a time (send, wait, judge), and with --queued calls sent to the worker before any answer
is read, as the runner sends a batch's re-runs over CUDA IPC (difftest.engine.batch_policy._each_alone).

    python bench/one_call.py --device cuda --backends torch,deepgemm --out reports/h200/one-call
    python bench/one_call.py --smoke --out /tmp/one-call     # CPU, torch, toy shape, few repeats (CI)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

import torch  # after the path: a plain checkout needs it

from difftest.backends import Loaded, get_backends
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import OracleKind
from difftest.engine.call import _private
from difftest.engine.comparison import compare
from difftest.engine.guards import Launch, execute
from difftest.engine.isolate import WorkerPool
from difftest.generators import CaseSpec, build_case
from difftest.oracles.reference import make_reference

GPU_CASE = CaseSpec(name="one-call-small", batch=8, next_n=2, heads=64, head_dim=128, block_size=64,
                    max_model_len=8192)
CPU_CASE = CaseSpec(name="one-call-small", batch=4, next_n=2, heads=8, head_dim=32, block_size=16, max_model_len=256)
BASELINE = "call in process"


def median_ms(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Median wall ms of `repeats` calls, the GPU idle before and after each."""
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def case_steps(spec: CaseSpec, device: str, repeats: int) -> dict[str, float]:
    """ms of the steps that do not depend on the backend."""
    case = build_case(spec, 1, device=device)
    oracle = OracleKind.FAST if device == "cuda" else OracleKind.EXACT
    return {"draw (build_case)": median_ms(lambda: build_case(spec, 1, device=device, validate=False), device, repeats),
            "validate": median_ms(case.validate, device, repeats),
            f"oracle ({oracle.value})": median_ms(lambda: make_reference(case, oracle), device, repeats)}


def backend_steps(backend: Loaded, spec: CaseSpec, device: str, repeats: int, queued: int) -> dict[str, float]:
    """ms of one backend's steps: encoding, its call three ways, the comparison."""
    case = build_case(spec, 1, device=device)
    ref = make_reference(case, OracleKind.FAST if device == "cuda" else OracleKind.EXACT)
    inputs = encode(case, backend.contract)
    launch = Launch(case.rows, case.max_model_len)
    got = execute(backend, inputs, launch).outputs[0]
    steps = {"encode + private copies": median_ms(lambda: _private(encode(case, backend.contract), case), device,
                                                  repeats),
             BASELINE: median_ms(lambda: execute(backend, inputs, launch), device, repeats),
             "compare": median_ms(lambda: compare(ref.logits, got, ref.row_lens, backend.contract, ref.bound,
                                                  next_n=case.next_n), device, repeats)}
    with WorkerPool([backend], device, timeout=120.0) as pool:
        (worker,) = pool.executors
        worker(backend, _private(inputs, case), launch)  # the worker's first call compiles and caches
        steps["call isolated"] = median_ms(lambda: worker(backend, _private(inputs, case), launch), device, repeats)
        start = time.perf_counter()
        waits = [worker.submit(backend, _private(inputs, case), launch) for _ in range(queued)]
        for wait in waits:
            wait()
        steps[f"call isolated, {queued} queued"] = 1e3 * (time.perf_counter() - start) / queued
    return steps


def markdown(header: str, shared: dict[str, float], per_backend: dict[str, dict[str, float]]) -> str:
    lines = [header, "", "| step | " + " | ".join(per_backend) + " |", "|---|" + "---|" * len(per_backend)]
    lines += [f"| {step} | " + " | ".join(f"{ms:.2f}" for _ in per_backend) + " |" for step, ms in shared.items()]
    steps = next(iter(per_backend.values()))
    lines += [f"| {step} | " + " | ".join(f"{row[step]:.2f}" for row in per_backend.values()) + " |"
              for step in steps]
    lines.append("| isolated / in process | " + " | ".join(f"{row['call isolated'] / row[BASELINE]:.2f}x"
                                                         for row in per_backend.values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backends", default="torch")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--queued", type=int, default=20, help="calls sent before any answer is read")
    parser.add_argument("--smoke", action="store_true", help="CPU, torch, the toy case, 3 repeats")
    parser.add_argument("--out", type=Path, required=True, help="folder for one_call.json and one_call.md")
    args = parser.parse_args(argv)
    if args.smoke:
        args.device, args.backends, args.repeats, args.queued = "cpu", "torch", 3, 3
    spec = GPU_CASE if args.device == "cuda" else CPU_CASE
    backends = get_backends(args.backends.split(","))
    shared = case_steps(spec, args.device, args.repeats)
    per_backend = {b.name: backend_steps(b, spec, args.device, args.repeats, args.queued) for b in backends}
    shape = (f"B={spec.batch} next_n={spec.next_n} H={spec.heads} D={spec.head_dim} block={spec.block_size} "
             f"max_model_len={spec.max_model_len}")
    header = (f"One small case ({shape}), {args.device}, median ms of {args.repeats}; torch {torch.__version__}. "
              f"Baseline: the {BASELINE}. The first rows do not depend on the backend.")
    table = markdown(header, shared, per_backend)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "one_call.md").write_text(table + "\n")
    (args.out / "one_call.json").write_text(json.dumps({"argv": sys.argv, "case": spec.to_json(), "shared": shared,
                                                        "backends": per_backend}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
