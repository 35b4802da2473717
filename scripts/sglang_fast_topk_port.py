"""A CPU port of the selection in SGLang 0.5.23's JIT `fast_topk` (sglang/kernels/jit/csrc/elementwise/
fast_topk.cuh, `radix_select_topk`, :49-211), written to read side by side with the kernel, and the same port
with its candidate limit lifted. docs/findings/sglang-fast-topk-crowded-bin.md explains what it shows.

The kernel runs one block of 1024 threads per row. Stage 1 ranks the fp16 top byte of each value (the coarse
bin, 256 bins) and finds the bin holding the k-th largest value; every candidate of that bin is appended to a
shared-memory list `s_input_idx[0]` of SMEM_INPUT_SIZE = 4096 entries, and a candidate whose slot
(`atomicAdd(&s_num_input[0], 1)`) is past the end is dropped, from the list and from the histogram of the
next byte (:129-137). Rounds 0-3 then refine the list on the bytes of the exact float32 key.

What the port models and what it cannot: the order in which a block's threads reach an atomicAdd is the
GPU's. The port takes candidates in column order (thread t handles columns t, t + 1024, ...: pass after
pass, that is ascending columns), so the 4096 kept are the bin's first 4096 columns. That is the order the
H200 showed on difftest's crowded-bin cases (the port's set equals the GPU's: scripts/device_visit.sh sglang-fast-topk
checks it on the device). Output slots follow the same order: `s_counter` slots from 0 upward, the last
round's ties from k - remaining upward (:192-194).

Run it (`PYTHONPATH=. python scripts/sglang_fast_topk_port.py`) for the finding's tables.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import torch

from difftest.backends.sglang_topk import SglangJitTopk
from difftest.core.topk import TopkCase
from difftest.generators.envelope import Target
from difftest.generators.topk import TopkPlanned, TopkSpec, TopkValues, WindowDist, build_topk_case, topk_plan
from scripts.torch_cuda_rand import H200_SMS, cuda_rand

THREADS = 1024  # kThreadsPerBlock (:15)
RADIX = 256
STASH_ENTRIES = 4096  # SMEM_INPUT_SIZE = kSmemBytes / (2 * sizeof(int)) = 32 KiB / 8 (:18, :55)
KS = (512, 2048)  # _FAST_TOPK_SUPPORTED_K (sglang/kernels/ops/attention/fast_topk.py:17)


def coarse_bin(values: np.ndarray) -> np.ndarray:
    """convert_to_uint8 (:28-33): the top byte of the order-preserving key of the value rounded to fp16
    (numpy's float16 cast rounds to nearest even, as __float2half_rn does)."""
    with np.errstate(over="ignore"):  # past 65504 the cast gives inf, as the kernel's does
        bits = values.astype(np.float32).astype(np.float16).view(np.uint16)
    key = np.where(bits & 0x8000, ~bits, bits | 0x8000).astype(np.uint16)
    return (key >> 8).astype(np.int64)


def exact_key(values: np.ndarray) -> np.ndarray:
    """convert_to_uint32 (:35-38): the order-preserving uint32 key of the float32 value."""
    bits = values.astype(np.float32).view(np.uint32)
    return np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)


def key_byte(keys: np.ndarray, shift: int) -> np.ndarray:
    """(key >> shift) & 0xFF, as the rounds take it (:168, :186, :202)."""
    return ((keys >> np.uint32(shift)) & np.uint32(0xFF)).astype(np.int64)


def threshold_bin(histogram: np.ndarray, topk: int) -> tuple[int, int]:
    """run_cumsum and the search after it (:78-100, :153-158): the bin b whose suffix count is > topk while
    bin b + 1's is <= topk, and how many values lie in the bins above b."""
    at_or_above = np.append(np.cumsum(histogram[::-1])[::-1], 0)  # s_histogram[b]; s_histogram[256] is 0
    found = np.flatnonzero((at_or_above[:-1] > topk) & (at_or_above[1:] <= topk))
    if found.size == 0:  # cannot happen while fewer than STASH_ENTRIES candidates are needed: kTopK <= 2048
        raise AssertionError(f"no threshold bin for topk {topk} in a histogram of {int(at_or_above[0])} values")
    return int(found[0]), int(at_or_above[found[0] + 1])


@dataclasses.dataclass(frozen=True)
class PortRun:
    """What one row's selection returned, and the coarse threshold bin's population (the list keeps at most
    STASH_ENTRIES of it)."""

    indices: np.ndarray  # int32 [k]: positions relative to the row's start, -1 past a short row
    coarse_population: int  # candidates in the coarse threshold bin (0 when the naive path ran)


class _Slots:
    """The row's k output slots: `s_counter` fills them from 0 (:110, :127, :170, :188)."""

    def __init__(self, k: int) -> None:
        self.out = np.full(k, -1, dtype=np.int32)
        self.counter = 0

    def emit(self, columns: np.ndarray) -> None:
        self.out[self.counter:self.counter + columns.size] = columns
        self.counter += columns.size


def fast_topk_row(values: np.ndarray, k: int, stash_entries: int | None = STASH_ENTRIES) -> PortRun:
    """One row of fast_topk<k>: `values` is the row's window (float32 [length]). `stash_entries` is the list's
    capacity per round; None lifts the limit (the list holds every candidate: the kernel with
    SMEM_INPUT_SIZE >= length)."""
    length = values.size
    if length <= k:  # naive_topk (:41-47, :224-225)
        return PortRun(np.where(np.arange(k) < length, np.arange(k), -1).astype(np.int32), 0)
    slots, keys, coarse = _Slots(k), exact_key(values), coarse_bin(values)
    threshold, above = threshold_bin(np.bincount(coarse, minlength=RADIX), k)  # stage 1 (:68-104)
    topk = k - above
    slots.emit(np.flatnonzero(coarse > threshold))  # :107-113 when topk == 0, :126-128 otherwise
    members = np.flatnonzero(coarse == threshold)
    if topk == 0:
        return PortRun(slots.out, members.size)
    listed = members[:stash_entries]  # `if (pos < int(SMEM_INPUT_SIZE))` (:130-137): the rest is dropped
    histogram = np.bincount(key_byte(keys[listed], 24), minlength=RADIX)
    for round_ in range(4):  # stage 2 (:143-210)
        threshold, above = threshold_bin(histogram, topk)
        topk -= above
        last_remain = topk  # s_last_remain (:157): the ties still to take in the last round
        digits = key_byte(keys[listed], 24 - 8 * round_)
        slots.emit(listed[digits > threshold])
        if topk == 0:  # :164-175
            break
        tied = listed[digits == threshold]
        if round_ == 3:  # `index[kTopK - pos]` for pos = last_remain, last_remain - 1, ..., 1 (:191-195)
            slots.out[k - last_remain:] = tied[:last_remain]
            break
        listed = tied[:stash_entries]  # the next round's list, capped the same way (:197-204)
        histogram = np.bincount(key_byte(keys[listed], 16 - 8 * round_), minlength=RADIX)
    return PortRun(slots.out, members.size)


def fast_topk(case: TopkCase, stash_entries: int | None = STASH_ENTRIES) -> torch.Tensor:
    """int32 [rows, k]: fast_topk(logits, lengths, k, row_starts) of every row of `case` through the port."""
    logits = case.logits.cpu().numpy()
    rows = [fast_topk_row(logits[r, int(case.starts[r]):int(case.ends[r])], case.k, stash_entries).indices
            for r in range(case.rows)]
    return torch.from_numpy(np.stack(rows))


def missing_tokens(values: np.ndarray, indices: np.ndarray, k: int) -> int:
    """Tokens of the row's true top-k (its values are distinct) that `indices` lacks."""
    truth = np.argsort(-values.astype(np.float64), kind="stable")[:min(k, values.size)]
    return int(np.setdiff1d(truth, indices[indices >= 0]).size)


# --------------------------------------------------------------------------- the cases

def smallest_case(reverse: bool = False) -> TopkCase:
    """The smallest case the port fails: one row of 4097 columns, k 512, values 1 + i * 2^-16 (distinct
    float32s, all in the coarse bin of [1, 1.25)). The largest, column 4096, is the bin's 4097th candidate:
    the one the list has no room for. `reverse` puts the largest first: the same values, which pass."""
    values = 1.0 + torch.arange(4097, dtype=torch.float32) * 2.0 ** -16
    values = values.flip(0) if reverse else values
    name = "fast-topk-4097-decreasing" if reverse else "fast-topk-4097-increasing"
    return TopkCase(name=name, storage=values[None, :].contiguous(), width=4097, starts=torch.tensor([0]),
                    ends=torch.tensor([4097]), k=512).validate()


def gpu_case(spec: TopkSpec, seed: int, sms: int = H200_SMS) -> TopkCase:
    """build_topk_case(spec, seed, "cuda") on the CPU, for a spec of crowded values in explicit or full windows
    (no random windows): the CPU case with the window values the CUDA generator draws (two torch.rand calls
    of rows x width: the keys ordering the window, then the values 1.0 + 0.245 * u)."""
    if spec.values != TopkValues.CROWDED or (spec.starts is None and spec.windows != WindowDist.FULL):
        raise ValueError(f"gpu_case regenerates crowded values in fixed windows, not {spec}")
    case = build_topk_case(spec, seed, "cpu")
    numel = spec.rows * spec.width
    _, offset = cuda_rand(seed, numel, 0, sms)
    drawn, _ = cuda_rand(seed, numel, offset, sms)
    values = torch.from_numpy(np.float32(1.0) + np.float32(0.245) * drawn).reshape(spec.rows, spec.width)
    columns = torch.arange(spec.width)
    inside = (columns >= case.starts[:, None]) & (columns < case.ends[:, None])
    storage = case.storage.clone()
    storage[:, :spec.width] = torch.where(inside, values, storage[:, :spec.width])
    return dataclasses.replace(case, storage=storage, meta={**case.meta, "regenerated": f"cuda, {sms} SMs"})


def crowded_specs() -> dict[str, TopkSpec]:
    """The crowded-bin family's specs as topk_plan gives them to sglang-jit-fast-topk at production scale."""
    plan = topk_plan(SglangJitTopk("sglang-jit-fast-topk").contract, Target.production_gpu(H200_SMS, 1 << 40))
    return {p.spec.name: p.spec for p in plan if isinstance(p, TopkPlanned) and "crowded" in p.spec.name}


def _row_report(case: TopkCase) -> str:
    """One line per row that the port gets wrong, and a summary line."""
    logits = case.logits.numpy()
    stock, lifted = fast_topk(case).numpy(), fast_topk(case, None).numpy()
    wrong = [(r, missing_tokens(logits[r, int(case.starts[r]):int(case.ends[r])], stock[r], case.k))
             for r in range(case.rows)]
    fixed = sum(missing_tokens(logits[r, int(case.starts[r]):int(case.ends[r])], lifted[r], case.k)
                for r in range(case.rows))
    bad = [(r, m) for r, m in wrong if m]
    first = f"; first row {bad[0][0]}: {bad[0][1]} missing" if bad else ""
    return (f"{case.name} [rows={case.rows} k={case.k} windows of {int(case.window_lens()[0])}]: port "
            f"{len(bad)}/{case.rows} rows wrong, {sum(m for _, m in wrong)} tokens missing{first}; "
            f"limit lifted: {fixed} missing")


def missing_by_population(k: int, population: int, rows: int = 8, seed: int = 0) -> tuple[float, float]:
    """(mean tokens missing over `rows` rows of `population` crowded values, uniform in [1, 1.245): one coarse
    bin; the expectation k * (population - 4096) / population when the values' order is random)."""
    rng = np.random.default_rng(seed)
    missing = []
    for _ in range(rows):
        values = (np.float32(1.0) + np.float32(0.245) * rng.random(population, dtype=np.float32)).astype(np.float32)
        missing.append(missing_tokens(values, fast_topk_row(values, k).indices, k))
    return float(np.mean(missing)), k * max(population - STASH_ENTRIES, 0) / population


DISTRIBUTIONS = {"N(0, 1)": (0.0, 1.0), "10 + 0.1 N(0, 1)": (10.0, 0.1)}  # the second: sglang#36807's fixture


def production_row(distribution: str, length: int, k: int, seed: int = 0) -> tuple[int, int]:
    """(the coarse threshold bin's population, tokens missing) of one row of `length` logits drawn from
    DISTRIBUTIONS[distribution]."""
    mean, scale = DISTRIBUTIONS[distribution]
    values = (mean + scale * np.random.default_rng(seed).standard_normal(length)).astype(np.float32)
    run = fast_topk_row(values, k)
    return run.coarse_population, missing_tokens(values, run.indices, k)


def main() -> int:
    """Print the port's verdicts on the GPU's crowded-bin cases, on the smallest case and its control, tokens
    missing against the bin's population, and rows of normal and concentrated logits."""
    specs = crowded_specs()
    for name in ("crowded-bin-2049", "crowded-bin-4097", "crowded-bin-16385", "rows-33-crowded", "rows-65-crowded"):
        print(_row_report(gpu_case(specs[name], 0)))
    for case in (smallest_case(), smallest_case(reverse=True)):
        print(_row_report(case))
    print("\nk     population  missing (mean of 8 rows)  k * (population - 4096) / population")
    for k in KS:
        for population in (4096, 4097, 4608, 8192, 16385, 65536):
            mean, expected = missing_by_population(k, population)
            print(f"{k:<5} {population:>10}  {mean:>24.1f}  {expected:>37.1f}")
    print("\nlogits            length     k  threshold-bin population  missing")
    for distribution in DISTRIBUTIONS:
        for length in (8192, 30938, 65504, 262144):
            for k in KS:
                population, missing = production_row(distribution, length, k)
                print(f"{distribution:<17} {length:>6} {k:>5}  {population:>24}  {missing:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
