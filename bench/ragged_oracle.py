"""The fused ragged Triton oracle (difftest/oracles/fused_ragged.py) against DeepGEMM's fp8_fp4_mqa_logits, on a GPU.

Shapes (H 64, D 128), the chunked prefill vLLM runs, one step of query rows over the keys of its requests:
* 8Kx64K-1req   one request: 8192 query rows after 57344 keys of context (windows of 57345 to 65536 keys);
* 8Kx64K-8req   eight requests of 1024 query rows after 7168 keys of context each (windows of up to 8192);
* 16Kx128K-2req two requests of 8192 query rows after 57344 keys each (the production plan's largest case).
The first is the headline: the goal is the fused oracle within 3x DeepGEMM's kernel there.

For each shape:
* fused     difftest.oracles.fused_ragged.prepared(case)(): logits and the per-row bound (the -inf fill, one
            kernel launch, a few tiny torch ops); the grid's one host read done once, outside the timing;
* DeepGEMM  fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, max_seqlen_k), as vLLM 0.33's
            prefill calls it (difftest.backends.deep_gemm_ragged), fp8 tensor cores: fast, not exact.
Each is timed as a call (CUDA events) and as GPU work alone (a CUDA-graph replay), with the method of
bench/fused_oracle.py (warm-up calls, L2 flushed before each timed call, the median). Before any number is
printed the fused oracle is checked against the float64 oracle on the shape's first and last 64 rows (every
difference inside the row's bound, the -inf pattern exact), and DeepGEMM's logits are judged against the fused
oracle's by the ragged comparison (its verdict is a column of the table).

    python bench/ragged_oracle.py --out reports/h200/ragged/bench     # writes bench.json + bench.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

import torch  # after the path: a plain checkout needs it

from bench.fused_oracle import time_events, time_graph  # the same timing method
from difftest.backends.deep_gemm_ragged import DeepGemmRagged
from difftest.core.ragged import RaggedCase, encode_ragged
from difftest.engine.ragged_comparison import compare_ragged
from difftest.generators.ragged import RaggedSpec, RaggedWindows, build_ragged_case
from difftest.oracles.fused_ragged import default_config, prepared
from difftest.oracles.ragged_mqa_logits import reference
from difftest.oracles.ragged_reference import RaggedReference

SHAPES = {  # name -> (contexts, query_lens)
    "8Kx64K-1req": ((57344,), (8192,)),
    "8Kx64K-8req": ((7168,) * 8, (1024,) * 8),
    "16Kx128K-2req": ((57344, 57344), (8192, 8192)),
}
CHECK_ROWS = 64  # rows at each end of a shape checked against the float64 oracle


def shape_case(name: str) -> RaggedCase:
    """The shape's chunked-prefill case, H 64, D 128, built on the GPU."""
    contexts, query_lens = SHAPES[name]
    spec = RaggedSpec(name=name, rows=sum(query_lens), keys=sum(contexts) + sum(query_lens), heads=64, head_dim=128,
                      windows=RaggedWindows.STAIRCASE, contexts=contexts, query_lens=query_lens)
    return build_ragged_case(spec, 0, device="cuda")


def rows_of(case: RaggedCase, rows: torch.Tensor) -> RaggedCase:
    """The case's rows `rows` over the same keys (a row's oracle values depend on its own window only)."""
    return dataclasses.replace(case, q=case.q[rows], weights=case.weights[rows], k_start=case.k_start[rows],
                               k_end=case.k_end[rows], max_seqlen_k=case.seqlen_k)


def check_fused(case: RaggedCase) -> float:
    """Worst |fused - float64| / bound over the first and last CHECK_ROWS rows (must be <= 1)."""
    rows = torch.cat([torch.arange(CHECK_ROWS), torch.arange(case.rows - CHECK_ROWS, case.rows)]).to(case.device)
    part = rows_of(case, rows)
    fused, exact = prepared(part)(), reference(part)
    if not torch.equal(torch.isneginf(fused.logits), torch.isneginf(exact)):
        raise AssertionError(f"{case.name}: the fused oracle's -inf pattern differs from the float64 oracle's")
    err = torch.where(torch.isfinite(exact), (fused.logits.double() - exact).abs(), 0.0).amax(dim=1)
    ratio = float((err / fused.bound.double().clamp_min(1e-300)).max())
    if ratio > 1:
        raise AssertionError(f"{case.name}: err/bound = {ratio}")
    return ratio


def deepgemm_call(case: RaggedCase) -> tuple[Callable[[], torch.Tensor] | None, str]:
    """A zero-argument DeepGEMM launch as vLLM makes it, or None and why not."""
    try:
        backend = DeepGemmRagged()
        reason = backend.unavailable_reason("cuda")
        if reason:
            return None, reason
        return backend.prepare(encode_ragged(case, backend.contract), None), ""
    except Exception as exc:  # a broken install must not hide the other columns
        return None, f"{type(exc).__name__}: {exc}"


def timed(fn: Callable[[], object] | None, why: str, args: argparse.Namespace, graph: bool) -> dict[str, object]:
    """{'ms': the median (None when `fn` is None or raised), 'note': why not}."""
    if fn is None:
        return {"ms": None, "note": why}
    try:
        return {"ms": (time_graph if graph else time_events)(fn, args.warmup, args.repeats), "note": ""}
    except Exception as exc:
        return {"ms": None, "note": f"{type(exc).__name__}: {str(exc)[:160]}"}


def bench_shape(name: str, args: argparse.Namespace) -> dict[str, object]:
    """One row of the table: the checks first, then both contenders timed both ways."""
    case = shape_case(name)
    margin = check_fused(case)
    fused = prepared(case)
    gemm, why = deepgemm_call(case)
    row: dict[str, object] = {
        "shape": name, "rows": case.rows, "keys": case.keys, "max_seqlen_k": case.seqlen_k,
        "logits_mb": case.rows * case.seqlen_k * 4 / 2**20, "err_over_bound": margin,
        "config": dataclasses.asdict(default_config(case, interpret=False)),
        "fused": timed(fused, "", args, graph=False), "fused_gpu": timed(fused, "", args, graph=True),
        "deepgemm": timed(gemm, why, args, graph=False), "deepgemm_gpu": timed(gemm, why, args, graph=True)}
    row["deepgemm_verdict"] = judge_deepgemm(case, gemm, fused) if gemm is not None else f"n/a ({why})"
    return row


def judge_deepgemm(case: RaggedCase, gemm: Callable[[], torch.Tensor], fused: Callable[[], object]) -> str:
    """DeepGEMM's logits against the fused oracle's, by the ragged comparison: its verdict and headline."""
    try:
        answer = fused()
        reference_ = RaggedReference(answer.logits, case.window_lens().clamp(max=case.seqlen_k), answer.bound)
        result = compare_ragged(reference_, gemm(), case, DeepGemmRagged().contract)
        return f"{result.verdict.value}: {result.headline()}"
    except Exception as exc:
        return f"ERROR: {type(exc).__name__}: {str(exc)[:160]}"


def markdown(rows: list[dict[str, object]], device: str) -> str:
    """The table, with the fused/DeepGEMM ratio of the GPU-only times."""
    lines = [f"Fused ragged oracle vs DeepGEMM fp8_fp4_mqa_logits on {device}; H 64, D 128; median ms (CUDA events, "
             "L2 flushed). 'GPU' columns: CUDA-graph replay (no host overhead).", "",
             "| shape | rows x max_seqlen_k | fused call | fused GPU | DeepGEMM call | DeepGEMM GPU "
             "| fused/DeepGEMM (GPU) | fused err/bound vs fp64 | DeepGEMM vs fused oracle |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [_cell(r[k]) for k in ("fused", "fused_gpu", "deepgemm", "deepgemm_gpu")]
        fused, gemm = r["fused_gpu"]["ms"], r["deepgemm_gpu"]["ms"]
        ratio = f"{fused / gemm:.2f}x" if fused and gemm else "n/a"
        lines.append(f"| {r['shape']} | {r['rows']} x {r['max_seqlen_k']} | {' | '.join(cells)} | {ratio} | "
                     f"{r['err_over_bound']:.3g} | {r['deepgemm_verdict']} |")
    return "\n".join(lines) + "\n"


def _cell(timing: dict[str, object]) -> str:
    return f"{timing['ms']:.3f}" if timing["ms"] is not None else f"n/a ({timing['note']})"


def main() -> int:
    """Every shape asked for, printed as it finishes; the table (and JSON) written where --out says."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write <out>.json and <out>.md")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {list(SHAPES)}")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    rows = []
    for name in args.shapes.split(","):
        rows.append(bench_shape(name, args))
        print(markdown(rows[-1:], device), flush=True)
        torch.cuda.empty_cache()
    table = markdown(rows, device)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(table)
        args.out.with_suffix(".json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
