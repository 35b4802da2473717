"""How fast difftest's oracle is, and how many cases per second `difftest run` gets through on the CPU.

Table 1 times `difftest.oracles.paged_mqa_logits.reference(case)` (float64) against a baseline in the style of
vLLM's `fp8_paged_mqa_logits_torch`: a Python loop over sequences and, inside, over each sequence's
blocks. Table 2 times the engine the way `difftest run --backends torch` drives it.

Run from the repository root:  python bench/oracle_vs_loop.py [--quick]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

# The script must run from a checkout that is not pip-installed (`python bench/oracle_vs_loop.py`).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from difftest.backends import Backend, available_names, get_backends, load_backend
from difftest.core.case import Case
from difftest.engine.config import RunConfig
from difftest.engine.result import CaseResult
from difftest.engine.runner import run
from difftest.generators import CaseSpec, build_case
from difftest.generators.cases import suite
from difftest.oracles.paged_mqa_logits import reference
from difftest.oracles.reference import make_reference

RTOL = 1e-9


# --- timing -----------------------------------------------------------------------------------

def medians_ms(fns: dict[str, Callable[[], object]], repeats: int,
               warm_up: bool = True) -> tuple[dict[str, float], dict[str, object]]:
    """Median wall time in ms of each function, and what its last call returned.

    Method: one untimed warm-up call of each (first-touch allocations, lazy imports, MKL/oneDNN
    setup), then `repeats` rounds that call every function once in turn, each call timed with
    time.perf_counter; the median per function. Interleaving makes the functions share whatever
    else the shared 2-core machine is doing, so their ratio is steadier than their absolute times.
    warm_up=False skips the warm-up call, for callers that warmed up on something smaller.
    """
    results = {name: fn() for name, fn in fns.items()} if warm_up else {}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}, results


# --- table 1: oracle against the per-block loop ------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Point:
    """A shape (the DeepSeek indexer's H 64, D 128, block 64 unless told) with lengths near max_model_len."""

    batch: int
    next_n: int
    max_model_len: int
    heads: int = 64
    head_dim: int = 128
    block_size: int = 64

    @property
    def label(self) -> str:
        return (f"B={self.batch} next_n={self.next_n} ctx={self.max_model_len // 1024}K H={self.heads} "
                f"D={self.head_dim} bs={self.block_size}")

    def spec(self) -> CaseSpec:
        # Steps of ~1.5% of the context: the first sequence is full, the others end mid-block.
        step = max(1, self.max_model_len // 67)
        lengths = tuple(self.max_model_len - step * i for i in range(self.batch))
        return CaseSpec(name="bench", heads=self.heads, head_dim=self.head_dim, block_size=self.block_size,
                        next_n=self.next_n,
                        max_model_len=self.max_model_len, lengths=lengths)


MAIN = Point(batch=8, next_n=2, max_model_len=4096)
# The point again at the default suite's head shape (H 32, D 64, block 16): four times the
# blocks for a quarter of the arithmetic per block, so per-block overhead weighs more in the loop.
MAIN_SUITE_SHAPE = Point(batch=8, next_n=2, max_model_len=4096, heads=32, head_dim=64, block_size=16)
POINTS = (Point(batch=4, next_n=2, max_model_len=1024), MAIN, MAIN_SUITE_SHAPE,
          Point(batch=16, next_n=2, max_model_len=8192))


def per_block_loop(case: Case) -> torch.Tensor:
    """Logits [rows, max_model_len] in float64, one block of one sequence at a time.

    The style of vLLM's fp8_paged_mqa_logits_torch (our own code): one length L per sequence, row j
    sees positions p <= L - next_n + j, each block scored with torch ops and written into the logits.
    Tables are read into Python lists once so the loop is as quick as the style allows and the ratio
    is not flattered. ReLU, head sum, then the token scale, in the oracle's (and DeepGEMM's) order,
    so the two agree to float64 rounding (bit for bit at the benchmark's shapes).
    """
    q, keys = case.q_values(), case.k_values()
    scales, weights = case.scale_pool.to(torch.float64), case.weights.to(torch.float64)
    next_n = case.next_n
    logits = torch.full((case.rows, case.max_model_len), -math.inf, dtype=torch.float64, device=case.device)
    tables = case.block_table.tolist()
    for b, length in enumerate(case.seq_lens.tolist()):
        blocks = tables[b]
        rows = slice(b * next_n, (b + 1) * next_n)
        last_visible = torch.arange(length - next_n, length, device=case.device)[:, None]
        for column in range(-(-length // case.block_size)):
            start = column * case.block_size
            block = _score_block(q[b], weights[rows], keys[blocks[column]], scales[blocks[column]])
            width = min(case.block_size, case.max_model_len - start)
            visible = torch.arange(start, start + width, device=case.device) <= last_visible
            logits[rows, start:start + width] = torch.where(visible, block[:, :width], -math.inf)
    return logits


def _score_block(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(next_n, block_size) logits of one block: q (next_n, H, D), weights (next_n, H), keys (bs, D)."""
    scores = torch.einsum("jhd,pd->jhp", q, keys).relu()
    return torch.einsum("jh,jhp->jp", weights, scores) * scales


def check_agrees(oracle: torch.Tensor, loop: torch.Tensor, label: str) -> None:
    """AssertionError unless both put -inf in the same places and agree to RTOL elsewhere."""
    if not torch.equal(torch.isneginf(oracle), torch.isneginf(loop)):
        raise AssertionError(f"{label}: the per-block loop's -inf pattern differs from the oracle's")
    # atol=0: every value, small ones included, must agree to RTOL relative to the oracle.
    torch.testing.assert_close(loop, oracle, rtol=RTOL, atol=0.0, msg=lambda m: f"{label}: {m}")


def oracle_row(point: Point, repeats: int, device: str) -> tuple[str, float, float]:
    """(label, oracle ms, loop ms) at one point, after checking that the loop is right."""
    case = build_case(point.spec(), seed=0, device=device)
    check_agrees(reference(case), per_block_loop(case), point.label)
    ms, _ = medians_ms({"oracle": lambda: _synced(reference, case), "loop": lambda: _synced(per_block_loop, case)},
                       repeats)
    return point.label, ms["oracle"], ms["loop"]


def _synced(fn: Callable[[Case], torch.Tensor], case: Case) -> torch.Tensor:
    """fn(case), waiting for the GPU so the host clock sees the work (no-op on the CPU)."""
    out = fn(case)
    if case.device.type == "cuda":
        torch.cuda.synchronize()
    return out


def print_oracle_table(points: tuple[Point, ...], repeats: int, device: str) -> dict[Point, float]:
    """Table 1; returns the ratio (loop / oracle) at each point."""
    # The load average is printed because other jobs on a 2-core machine move these numbers by 2-5x.
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"Oracle speed: reference(case) vs per-block loop, float64, {where}, "
          f"median of {repeats} after 1 warm-up, load average {os.getloadavg()[0]:.2f}")
    print(f"{'shape':<44} {'oracle ms':>10} {'loop ms':>10} {'loop/oracle':>12}")
    ratios = {}
    for point in points:
        label, oracle_ms, loop_ms = oracle_row(point, repeats, device)
        print(f"{label:<44} {oracle_ms:>10.1f} {loop_ms:>10.1f} {loop_ms / oracle_ms:>11.2f}x")
        ratios[point] = loop_ms / oracle_ms
    return ratios


# --- table 2: cases per second of `difftest run` -----------------------------------------------

def build_cases(pairs: list[tuple[CaseSpec, int]]) -> list[Case]:
    # Named as cmd_run names them, so the engine sees exactly what `difftest run` builds.
    return [build_case(spec, seed) for spec, seed in pairs]


def generate_and_reference(pairs: list[tuple[CaseSpec, int]]) -> None:
    # make_reference is what runner.run computes once per case: oracle logits plus the fp32 bound.
    for case in build_cases(pairs):
        make_reference(case)


def full_run(pairs: list[tuple[CaseSpec, int]], backend: Backend) -> list[CaseResult]:
    cases = (build_case(spec, seed) for spec, seed in pairs)
    return run([backend], cases, RunConfig(device="cpu"))


def aiter_backends(which: str) -> tuple[list[Backend], list[str]]:
    """Registered AITER backends that run on the CPU ('first', 'all' or 'none'), and why others do not."""
    if which == "none":
        return [], []
    names = [name for name, target in available_names().items() if "aiter" in f"{name} {target}".lower()]
    if not names:
        return [], ["no AITER backend registered"]
    backends: list[Backend] = []
    notes: list[str] = []
    for name in names[:1] if which == "first" else names:
        try:
            backend = load_backend(available_names()[name], f"backend {name!r}")
        except Exception as exc:  # being written concurrently: a broken module is a note, never the bench's end
            notes.append(f"{name}: cannot load ({type(exc).__name__}: {exc})")
            continue
        reason = backend.unavailable_reason("cpu")
        if reason is None:
            backends.append(backend)
        else:
            notes.append(f"{name}: unavailable on cpu ({reason})")
    return backends, notes


def verdict_counts(results: list[CaseResult]) -> str:
    counts = collections.Counter(r.verdict.value for r in results)
    return ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items()))


def print_stage(label: str, ms: float, cases: int, result: object) -> None:
    verdicts = verdict_counts(result) if isinstance(result, list) and label.startswith("full") else ""
    print(f"{label:<44} {ms / 1e3:>9.3f} {cases / (ms / 1e3):>9.1f}  {verdicts}")


def print_throughput_table(repeats: int, aiter: str) -> None:
    """Table 2: cases/s for generation, generation + oracle, and full runs per backend."""
    pairs = suite("all")  # `difftest run`'s defaults: --cases all --count 6 --seed 0
    torch_backend = get_backends(["torch"])[0]
    stages: dict[str, Callable[[], object]] = {
        "generation only": lambda: build_cases(pairs),
        "generation + oracle": lambda: generate_and_reference(pairs),
        "full run, torch backend": lambda: full_run(pairs, torch_backend),
    }
    print(f"difftest run throughput: suite 'all' ({len(pairs)} cases), CPU, median of {repeats} after 1 warm-up")
    print(f"{'stage':<44} {'s/suite':>9} {'cases/s':>9}  verdicts")
    ms, results = medians_ms(stages, repeats)
    for label in stages:
        print_stage(label, ms[label], len(pairs), results[label])
    backends, notes = aiter_backends(aiter)
    for backend in backends:
        # The Triton interpreter takes 13-75 s a suite here: warm up on 2 cases, time one full run.
        full_run(pairs[:2], backend)
        ms, results = medians_ms({"run": lambda b=backend: full_run(pairs, b)}, 1, warm_up=False)
        print_stage(f"full run, {backend.name} (1 run)", ms["run"], len(pairs), results["run"])
    for note in notes:
        print(f"(no AITER row: {note})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="only the B=8, next_n=2, 4K point, and fewer repeats")
    parser.add_argument("--aiter", choices=("first", "all", "none"), default="first",
                        help="which registered AITER backends get a row in table 2 (default: first; "
                             "each takes 13-75 s under the Triton interpreter)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where table 1 runs (table 2 is the CPU engine and is skipped on cuda)")
    args = parser.parse_args(argv)
    points, repeats = ((MAIN, MAIN_SUITE_SHAPE), 3) if args.quick else (POINTS, 7)
    ratios = print_oracle_table(points, repeats, args.device)
    for point in (MAIN, MAIN_SUITE_SHAPE):
        verdict = "met" if ratios[point] >= 10 else "missed: see bench/README.md"
        print(f"oracle is {ratios[point]:.1f}x faster than the per-block loop at {point.label} "
              f"(target >= 10x: {verdict})")
    if args.device == "cpu":
        print()
        print_throughput_table(3 if args.quick else 5, args.aiter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
