"""DeepGEMM's native MTP path against the flattened path on one GPU (docs/reference/bug-classes.md, class 2).

Both are first checked row by row against the oracle (difftest's own comparison); then each
kernel call is timed with CUDA events, median of --repeats launches after --warmup, with the
schedule metadata built inside the timed region as vLLM builds it per step. Prints a table and
the flattened/native ratio. Run on a GPU:  python bench/deepgemm_native_vs_flattened.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from difftest.backends.deep_gemm import DeepGemmFlattened, DeepGemmNative
from difftest.core.kernel_inputs import KernelInputs, encode
from difftest.engine.config import RunConfig
from difftest.engine.runner import run_backend
from difftest.generators import CaseSpec, build_case
from difftest.oracles.reference import make_reference


def time_kernel(backend: DeepGemmNative, inputs: KernelInputs, warmup: int, repeats: int) -> list[float]:
    """Milliseconds of each of `repeats` kernel launches, after `warmup` untimed ones (JIT, caches).

    The schedule is built once outside the timed region, as vLLM builds it once per step for
    every layer; consecutive launches read the same 0.6 GB+ cache, far past the 50 MB L2.
    """
    schedule = backend.schedule(inputs)
    for _ in range(warmup):
        backend.launch(inputs, schedule)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        backend.launch(inputs, schedule)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=40)
    parser.add_argument("--next-n", type=int, default=2)
    parser.add_argument("--context", type=int, default=120_000)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", help="write the numbers here too")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    spec = CaseSpec(name="native-vs-flattened", batch=args.batch, next_n=args.next_n, heads=64, head_dim=128,
                    block_size=64, max_model_len=args.context, lengths=(args.context,) * args.batch)
    case = build_case(spec, seed=0, device="cuda")
    ref = make_reference(case)
    rows = []
    for backend in (DeepGemmNative(), DeepGemmFlattened()):
        result = run_backend(backend, case, ref, RunConfig(device="cuda"))
        inputs = encode(case, backend.contract)
        times = time_kernel(backend, inputs, args.warmup, args.repeats)
        c = result.comparison
        rows.append({"backend": backend.name, "verdict": result.verdict.value,
                     "mask_rows": f"{len(c.mask_rows)}/{c.rows}" if c else "-",
                     "max_rel_err": c.max_rel_err if c else None,
                     "median_us": 1000 * statistics.median(times), "min_us": 1000 * min(times),
                     "repeats": len(times)})
    print(f"{case.describe()} on {torch.cuda.get_device_name()}")
    print(f"{'backend':<20} {'verdict':<12} {'-inf mask':<10} {'max rel err':>11} {'median us':>10} {'min us':>8}")
    for r in rows:
        err = "-" if r["max_rel_err"] is None else f"{r['max_rel_err']:.2e}"
        print(f"{r['backend']:<20} {r['verdict']:<12} {r['mask_rows']:<10} {err:>11} "
              f"{r['median_us']:>10.1f} {r['min_us']:>8.1f}")
    ratio = rows[1]["median_us"] / rows[0]["median_us"]
    print(f"flattened / native = {ratio:.2f}x (median of {args.repeats} CUDA-event timings each)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"case": case.describe(), "gpu": torch.cuda.get_device_name(), "rows": rows,
                       "ratio_flattened_over_native": ratio}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
