"""The fused Triton oracle (difftest/oracles/fused.py) against the torch oracles and DeepGEMM's kernel, on a GPU.

For each shape (H 64, D 128, block 64, every sequence at the full context):
* fused        fused_reference(case): logits and the per-row bound, one kernel launch plus a few
               tiny torch ops; timed as a whole call, and as the GPU work alone (CUDA-graph replay);
* torch fp32 / torch fp64   difftest.oracles.paged_mqa_logits.reference(case, dtype) (logits only);
* DeepGEMM     DeepGemmNative().launch(inputs, schedule), the schedule built once outside the
               timing, as vLLM builds it once per step (fp8 tensor cores: fast, not exact).
The fused logits are checked against the float64 oracle (every difference inside the bound) before
any number is printed. Peak extra memory is torch.cuda.max_memory_allocated during one call, minus
what was allocated before it, minus the fp32 logits [rows, max_model_len] the call returns.

Timing method (as triton.testing.do_bench): warm-up calls first (compilation, caches); then for
each of `repeats` calls, a 256 MB buffer is zeroed so no input is left in the 50 MB L2, and the
call is bracketed by two CUDA events; the median of the event times is reported.

    python bench/fused_oracle.py --out reports/h200/fused-oracle/bench     # writes bench.json + bench.md
    python bench/fused_oracle.py --sweep   # also times alternative tile configs of the fused kernel
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

import torch  # after the path: a plain checkout needs it

from difftest.core.case import Case
from difftest.generators import CaseSpec, build_case
from difftest.oracles.fused import KernelConfig, default_config, fused_reference, launch_plan
from difftest.oracles.paged_mqa_logits import reference

SHAPES = ((40, 2, 120_000), (16, 4, 32_768), (64, 1, 8_192))  # (B, next_n, context)
_FLUSH_BYTES = 256 << 20


@dataclasses.dataclass
class Timing:
    median_ms: float | None = None
    extra_mb: float | None = None  # peak memory beyond the fp32 logits
    note: str = ""

    def cell(self) -> str:
        return f"n/a ({self.note})" if self.median_ms is None else f"{self.median_ms:.3f}"


# --------------------------------------------------------------------------- timing

def time_events(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median ms of `repeats` calls, each between two CUDA events, L2 flushed before each."""
    flush = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_graph(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """The same for the GPU work alone: `fn` captured once in a CUDA graph, each replay timed."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_events(graph.replay, 1, repeats)


def peak_extra_mb(fn: Callable[[], object], logits_bytes: int) -> float:
    """MB allocated at the peak of one call beyond what was there before and the fp32 logits."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before - logits_bytes) / 2**20


# --------------------------------------------------------------------------- the contenders

def check_fused(case: Case, exact: torch.Tensor) -> float:
    """Worst |fused - float64| / bound over the case (must be <= 1); raises if the -inf pattern differs."""
    fused = fused_reference(case)
    if not torch.equal(torch.isneginf(fused.logits), torch.isneginf(exact)):
        raise AssertionError(f"{case.describe()}: -inf pattern differs from the float64 oracle")
    err = torch.where(torch.isfinite(exact), (fused.logits.double() - exact).abs(), 0.0).amax(dim=1)
    ratio = float((err / fused.bound.double().clamp_min(1e-300)).max())
    if ratio > 1:
        raise AssertionError(f"{case.describe()}: err/bound = {ratio}")
    return ratio


def deepgemm_call(case: Case) -> tuple[Callable[[], object] | None, str]:
    """A zero-argument DeepGEMM launch on a prebuilt schedule, or None and why not."""
    try:
        from difftest.backends.deep_gemm import DeepGemmNative
        from difftest.core.kernel_inputs import encode
        backend = DeepGemmNative()
        reason = backend.unavailable_reason("cuda")
        if reason:
            return None, reason
        inputs = encode(case, backend.contract)
        schedule = backend.schedule(inputs)
        return (lambda: backend.launch(inputs, schedule)), ""
    except Exception as exc:  # a broken install must not hide the other columns
        return None, f"{type(exc).__name__}: {exc}"


def measure(name: str, fn: Callable[[], object] | None, why: str, logits_bytes: int, warmup: int,
            repeats: int, graph: bool = False) -> Timing:
    if fn is None:
        return Timing(note=why)
    try:
        ms = (time_graph if graph else time_events)(fn, warmup, repeats)
        return Timing(median_ms=ms, extra_mb=peak_extra_mb(fn, logits_bytes))
    except Exception as exc:
        return Timing(note=f"{name}: {type(exc).__name__}: {str(exc)[:120]}")


def bench_shape(batch: int, next_n: int, context: int, args: argparse.Namespace) -> dict[str, object]:
    spec = CaseSpec(name=f"bench-b{batch}-mtp{next_n}-{context}", lengths=(context,) * batch, max_model_len=context,
                    heads=64, head_dim=128, block_size=64, next_n=next_n)
    case = build_case(spec, 0, device="cuda")
    logits_bytes = case.rows * case.max_model_len * 4
    exact = reference(case)
    margin = check_fused(case, exact)
    del exact
    gemm, why = deepgemm_call(case)
    row: dict[str, object] = {
        "shape": f"B={batch} next_n={next_n} ctx={context}", "rows": case.rows, "logits_mb": logits_bytes / 2**20,
        "config": dataclasses.asdict(default_config(case, interpret=False)),
        "plan": dataclasses.asdict(launch_plan(case)), "err_over_bound": margin,
        "fused": measure("fused", lambda: fused_reference(case), "", logits_bytes, args.warmup, args.repeats),
        "fused_gpu": measure("fused", lambda: fused_reference(case), "", logits_bytes, args.warmup, args.repeats,
                             graph=True),
        "deepgemm": measure("deepgemm", gemm, why, logits_bytes, args.warmup, args.repeats),
        "deepgemm_gpu": measure("deepgemm", gemm, why, logits_bytes, args.warmup, args.repeats, graph=True),
        "torch_fp32": measure("torch fp32", lambda: reference(case, torch.float32), "", logits_bytes, 1,
                              args.slow_repeats),
        "torch_fp64": measure("torch fp64", lambda: reference(case), "", logits_bytes, 1, args.slow_repeats),
    }
    if args.sweep:
        row["sweep"] = sweep(case, args)
    return row


def sweep_configs(case: Case, chunks: list[int]) -> list[KernelConfig]:
    """The default, then tiles per program (`chunks`) and register caps around it (the two knobs that
    measured differently per shape; reports/h200/fused-oracle/README.md lists the ones that lost)."""
    base = default_config(case, interpret=False)
    sized = [dataclasses.replace(base, chunk_tiles=c) for c in chunks]
    caps = [dataclasses.replace(base, maxnreg=r) for r in (None, 128, 168, 200) if r != base.maxnreg]
    return [base, *sized, *caps]


def sweep(case: Case, args: argparse.Namespace) -> list[dict[str, object]]:
    """GPU time (graph replay) of each config; each one's logits checked against the default's."""
    rows, baseline = [], fused_reference(case)
    for config in sweep_configs(case, args.chunks):
        try:
            other = fused_reference(case, config)
            diff = float((other.logits - baseline.logits).nan_to_num(0.0).abs().amax())
            ms = time_graph(lambda c=config: fused_reference(case, c), args.warmup, args.repeats)
            rows.append({"config": dataclasses.asdict(config), "gpu_ms": ms, "max_diff_vs_default": diff})
        except Exception as exc:
            rows.append({"config": dataclasses.asdict(config), "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
        last = rows[-1]
        outcome = last.get("error") or f"{last['gpu_ms']:.4f} ms, max diff {last['max_diff_vs_default']:.3g}"
        print(f"  sweep {_short(config)}: {outcome}", flush=True)
    return rows


# --------------------------------------------------------------------------- output

def _short(config: KernelConfig) -> str:
    return " ".join(f"{k}={v}" for k, v in dataclasses.asdict(config).items())


def markdown(rows: list[dict[str, object]], device: str) -> str:
    lines = [f"Fused oracle vs torch oracles and DeepGEMM on {device}; median ms (CUDA events, L2 flushed). "
             "'GPU' columns: CUDA-graph replay (no host overhead).", "",
             "| shape | fused call | fused GPU | DeepGEMM | DeepGEMM GPU | fused/DeepGEMM (GPU) | torch fp32 "
             "| torch fp64 | fused extra MB / logits MB | err/bound vs fp64 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fused, gemm = r["fused_gpu"], r["deepgemm_gpu"]
        ratio = (f"{fused.median_ms / gemm.median_ms:.2f}x" if fused.median_ms and gemm.median_ms
                 else f"n/a ({gemm.note})")
        extra = r["fused"].extra_mb
        memory = "n/a" if extra is None else f"{extra:.2f} / {r['logits_mb']:.1f} ({extra / r['logits_mb']:.3f}x)"
        plan = f"{r['plan']['tiles']} tiles a program, {r['plan']['at_once']} at once"
        lines.append(f"| {r['shape']} ({plan}) | {r['fused'].cell()} | {fused.cell()} | "
                     f"{r['deepgemm'].cell()} | "
                     f"{gemm.cell()} | {ratio} | {r['torch_fp32'].cell()} | {r['torch_fp64'].cell()} | {memory} | "
                     f"{r['err_over_bound']:.3g} |")
    return "\n".join(lines) + "\n"


def to_json(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: dataclasses.asdict(v) if isinstance(v, Timing) else v for k, v in r.items()} for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write <out>.json and <out>.md")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--slow-repeats", type=int, default=3, help="repeats of the torch oracles")
    parser.add_argument("--sweep", action="store_true", help="also time alternative fused-kernel configs")
    parser.add_argument("--chunks", type=lambda text: [int(c) for c in text.split(",")], default=[8, 16, 32, 64],
                        help="comma-separated tiles per program the sweep times")
    parser.add_argument("--shapes", default=",".join(f"{b}x{n}x{c}" for b, n, c in SHAPES),
                        help="comma-separated BxNEXT_NxCONTEXT")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    rows = []
    for shape in args.shapes.split(","):
        batch, next_n, context = (int(x) for x in shape.split("x"))
        rows.append(bench_shape(batch, next_n, context, args))
        print(markdown(rows[-1:], device), flush=True)
    table = markdown(rows, device)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(table)
        args.out.with_suffix(".json").write_text(json.dumps({"device": device, "rows": to_json(rows)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
