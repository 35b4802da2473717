"""FlagGems 5.0.2 `bucket_sort_topk`: one row's candidates landing in the next row's candidate list
(docs/findings/flaggems-bucket-topk-candidate-overflow.md), shown on the CPU and measured on the GPU.

    PYTHONPATH=.:FLAG_GEMS_TREE python3 scripts/flaggems_topk_overlap.py                  (CPU, about 30 s)
    PYTHONPATH=.:FLAG_GEMS_TREE python3 scripts/flaggems_topk_overlap.py --device cuda   (device_visit.sh flaggems-topk)

CPU: the H200's FAIL(duplicate) case (random-k2048-s0's windows) through the kernel under the interpreter, in
the interpreter's order (one row after another) and with row 2's overflow landing after row 3 wrote its own
list (FlagGemsBucketTopk(overflow_lands_late=True)); then a hand model of the kernel's selection (numpy, read
from bin_topk.py:88-248) on the same lists, which must agree with the kernel and says which late entries give
the H200's exact first duplicate. Last, 8 of the GPU's pairs (below) drawn on the CPU, with the overflow
landing before each row's first read of its list and between its first round's two reads (Landing.REREAD): the
second gives the H200's FAIL(out-of-window) on the one-token rows.

GPU: cases launched as the wrapper launches them (autotuned), `--repeat` times each: the H200's case, and 32
pairs of rows (a window of one token before a full window of 8192, k 2048), with N(0, 1) and with crowded
values: how often each kind of row comes out wrong, the autotuner's config, the ids written past the list; and
random-k512 called twice (the writes past the list and the sets of the two calls).
"""

from __future__ import annotations

import argparse
import warnings
from collections import Counter

import numpy as np
import torch

from difftest.backends.flaggems_topk import SMEM_INPUT_SIZE, FlagGemsBucketTopk, load_kernels
from difftest.core.topk import TopkCase, encode_topk
from difftest.core.triton_interpret import Landing
from difftest.engine.topk_comparison import compare_topk
from difftest.generators.topk import TopkSpec, TopkValues, build_topk_case
from difftest.oracles.topk import reference

# The H200's case: its windows as the GPU drew them (`difftest run --op topk`, seed 0). Rows 2 and 3 hold fewer
# than k values, so their threshold bin is bin 0, every lane outside the window: 5472 and 4464 candidates.
H200_WINDOWS = ((1881, 827, 4711, 1052), (6026, 5033, 5383, 2732))
H200_FIRST_DUPLICATE = (1915, 6064)  # row 3: slot, index
PAIRS = 32


def first_duplicate(selected: list[int]) -> tuple[int, int] | None:
    """(slot, index) of the first index selected a second time."""
    seen: set[int] = set()
    for slot, index in enumerate(selected):
        if index in seen:
            return slot, index
        seen.add(index)
    return None


# --------------------------------------------------------------------------- the hand model (bin_topk.py)

def keys(values: np.ndarray) -> np.ndarray:
    """convert_to_uint32 (:33-41): the float's bits, inverted when negative, the sign bit set otherwise."""
    values = np.asarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    return np.where(values < 0, ~bits, bits | np.uint32(0x80000000)).astype(np.uint32)


def threshold(byte: np.ndarray, need: int) -> tuple[int, int]:
    """(threshold bin, count above it): the bin whose suffix count passes `need` while the next one's does not."""
    suffix = np.cumsum(np.bincount(byte, minlength=256)[::-1])[::-1]
    above = np.append(suffix[1:], 0)
    bin_id = int(np.argmax((suffix > need) & ((above <= need) | (np.arange(256) == 255))))
    return bin_id, int(above[bin_id])


def first_pass(row: np.ndarray, start: int, end: int, k: int, bs: int) -> tuple[list[int], list[int], int]:
    """(selected lanes, candidate list, picks still needed) of one row's first pass (:88-149): every lane of
    ceil(width / bs) blocks; those outside the window load -inf."""
    width = len(row)
    lanes = np.arange(-(-width // bs) * bs)
    inside = (lanes >= start) & (lanes < end) & (lanes < width)
    byte = keys(np.where(inside, row[np.minimum(lanes, width - 1)], -np.inf)) >> 24
    bin_id, above = threshold(byte, k)
    return lanes[byte > bin_id].tolist(), lanes[byte == bin_id].tolist(), k - above


def rounds(read: np.ndarray, selected: list[int], candidates: list[int], need: int, bss: int) -> list[int]:
    """The four byte rounds and the final fill (:151-248). `read` is the memory the row's loads see from its own
    base (column c at read[c], -1 at read[-1]); a block's lanes past the count are index -1 with value -inf
    (round 0) or 0.0 (after), and join the list when their byte is the threshold."""
    for round_ in range(4):
        if need <= 0:
            break
        padding = -(-len(candidates) // bss) * bss - len(candidates)
        values = read[np.array(candidates, dtype=np.int64)]
        values = np.append(values, np.full(padding, 0.0 if round_ else -np.inf, np.float32))
        byte = (keys(values) >> (24 - 8 * round_)) & 0xFF
        bin_id, above = threshold(byte, need)
        need -= above
        listed = candidates + [-1] * padding
        selected = selected + [c for c, b in zip(listed, byte, strict=True) if b > bin_id]
        candidates = [c for c, b in zip(listed, byte, strict=True) if b == bin_id]
    return selected + candidates[:max(need, 0)]


def model_row3(case: TopkCase, late: range, bs: int = 1024, bss: int = 256) -> list[int]:
    """Row 3 of the H200's case by the model, with row 2's entries for row 3's list positions `late` landing
    after row 3's own (row 2's list spills into row 3's from its 4097th entry on)."""
    storage = case.storage.numpy()
    _, spill, _ = first_pass(storage[2], int(case.starts[2]), int(case.ends[2]), case.k, bs)
    selected, candidates, need = first_pass(storage[3], int(case.starts[3]), int(case.ends[3]), case.k, bs)
    for position in late:
        candidates[position] = spill[SMEM_INPUT_SIZE + position]
    read = np.concatenate([storage[3], np.full(2 * bs, -np.inf, np.float32), storage[2, -1:]])  # -1 wraps last
    return rounds(read, selected, candidates, need, bss)


# --------------------------------------------------------------------------- the CPU

def h200_case() -> TopkCase:
    """The H200's windows drawn on the CPU: other values inside the windows, the same outside (HOSTILE rises
    with the column). Row 3's picks do not depend on the inside values: its 1680 are all picked by the first
    pass, its other 368 are the largest outside values."""
    starts, ends = H200_WINDOWS
    return build_topk_case(TopkSpec(name="random-k2048-h200", rows=4, width=6144, k=2048, starts=starts, ends=ends), 0)


def kernel_run(case: TopkCase, late: bool) -> tuple[str, list[int]]:
    """The kernel under the interpreter, in its own order or with the overflow landing late: (verdict, row 3)."""
    backend = FlagGemsBucketTopk(overflow_lands_late=late)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # row 3 writes 368 ids past the list: the finding's first symptom
        got = backend(encode_topk(case, backend.contract), None)
    result = compare_topk(reference(case, backend.contract.nan), got, case, backend.contract)
    return result.verdict.value, got[3].tolist()


def on_cpu() -> None:
    case, spilled = h200_case(), range(5472 - SMEM_INPUT_SIZE)
    print(f"{case.describe()} (CPU draw)")
    for late, schedule in ((False, "rows one after another"), (True, "row 2's 1376 spilled entries late")):
        verdict, row3 = kernel_run(case, late)
        model = model_row3(case, spilled if late else range(0))
        print(f"{schedule}: kernel {verdict}, row 3 lists {len(row3) - len(set(row3))} indices twice, first "
              f"duplicate (slot, index) {first_duplicate(row3)}, 6064 at slots "
              f"{[i for i, x in enumerate(row3) if x == 6064]}; the hand model "
              f"{'agrees' if model == row3 else 'DIFFERS'}")
    storage = case.storage.numpy()
    for row in range(4):
        listed = first_pass(storage[row], int(case.starts[row]), int(case.ends[row]), case.k, 1024)[1]
        where = listed.index(6064) if 6064 in listed else None
        landing = ""
        if where is not None and where >= SMEM_INPUT_SIZE:
            landing = f" (row {row + 1}'s position {where - SMEM_INPUT_SIZE})" if row < 3 else " (past the buffer)"
        print(f"row {row}: window [{int(case.starts[row])}, {int(case.ends[row])}), {len(listed)} candidates, "
              f"6064 at position {where}{landing}")
    partial = range(1296, 1312)
    print(f"model, only row 2's entries for row 3's positions [{partial.start}, {partial.stop}) (columns 6064-6079) "
          f"late: first duplicate {first_duplicate(model_row3(case, partial))}; the H200's: {H200_FIRST_DUPLICATE}")
    pairs_on_cpu()


def pairs_on_cpu(pairs: int = 8) -> None:
    """The GPU's N(0, 1) pairs on the CPU in both late schedules: each kind of row's verdicts, and the indices the
    last row stores past the output. Between the reads, a full row's first round counts its picks on its own list
    and stores them from the one-token row's ids: more than k, the excess in the next one-token row's slots."""
    case = gpu_cases("cpu", pairs)[1]
    for landing in (Landing.FIRST_READ, Landing.REREAD):
        backend = FlagGemsBucketTopk(overflow_lands_late=True, landing=landing)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the last row's indices past the output: counted below
            got = backend(encode_topk(case, backend.contract), None)
        result = compare_topk(reference(case, backend.contract.nan), got, case, backend.contract)
        kinds = [Counter(result.row_verdict(row).value for row in range(first, case.rows, 2)) for first in (0, 1)]
        print(f"{case.describe()}, overflow landing {landing.value}: {result.verdict.value}; one-token rows "
              f"{dict(kinds[0])}, full rows {dict(kinds[1])}; one-token rows whose slot 0 is not column 0: "
              f"{int((got[2::2, 0] != 0).sum())}; indices past the output {backend.last_indices_out_of_bounds}")


# --------------------------------------------------------------------------- the GPU

def gpu_cases(device: str, pairs: int = PAIRS) -> list[TopkCase]:
    """The H200's case as the GPU draws it (seed 0 of random-k2048), and the pairs: even rows a window of one
    token (5119-8191 lanes in bin 0, spilling lanes 4097.. into the next row's list), odd rows a full window of
    N(0, 1) values (about 2300 candidates in the threshold bin) or of crowded ones (all 8192)."""
    windows = {"starts": (0,) * 2 * pairs, "ends": (1, 8192) * pairs}
    specs = [TopkSpec(name="random-k2048", rows=4, width=6144, k=2048),
             TopkSpec(name="pairs-normal", rows=2 * pairs, width=8192, k=2048, **windows),
             TopkSpec(name="pairs-crowded", rows=2 * pairs, width=8192, k=2048, values=TopkValues.CROWDED, **windows)]
    return [build_topk_case(spec, 0, device) for spec in specs]


def repeated(case: TopkCase, repeat: int) -> None:
    """`repeat` calls: how many came out wrong, which rows, the first call's writes past the list."""
    backend = FlagGemsBucketTopk()
    truth = reference(case, backend.contract.nan)
    verdicts, rows, first_dups = Counter(), Counter(), Counter()
    for call in range(repeat):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = backend(encode_topk(case, backend.contract), None)
        result = compare_topk(truth, got, case, backend.contract)
        if call == 0:
            tuned = load_kernels(interpret=False).kernel_bucket_sort_topk if case.device.type == "cuda" else None
            print(f"{case.describe()}: config {getattr(tuned, 'best_config', 'CPU_CONFIG')}; first call: "
                  f"{backend.last_out_of_bounds} ids past the list {[str(w.message) for w in caught][:1]}")
        verdicts[result.verdict.value] += 1
        rows.update(result.wrong_rows)
        if case.name.startswith("random-k2048"):
            first_dups[first_duplicate(got[3].tolist())] += 1
    print(f"  {repeat} calls: {dict(verdicts)}; wrong rows (row: calls) {dict(sorted(rows.items())[:12])}"
          f"{' ...' if len(rows) > 12 else ''}; even rows wrong {sum(v for r, v in rows.items() if r % 2 == 0)}, "
          f"odd {sum(v for r, v in rows.items() if r % 2)}")
    if first_dups:
        print(f"  row 3's first duplicate (slot, index): calls {dict(first_dups.most_common(8))}")


def twice(spec: TopkSpec, device: str) -> None:
    """`spec` (seed 0) called twice: the ids past the list each time, whether the two sets differ."""
    backend, case = FlagGemsBucketTopk(), build_topk_case(spec, 0, device)
    outs = []
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs.append(backend(encode_topk(case, backend.contract), None))
        print(f"{case.describe()}: {backend.last_out_of_bounds} ids past the list {[str(w.message) for w in caught]}")
    verdicts = [compare_topk(reference(case, backend.contract.nan), out, case, backend.contract).verdict
                for out in outs]
    differ = bool((outs[0].sort(dim=1).values != outs[1].sort(dim=1).values).any())
    print(f"  verdicts {[v.value for v in verdicts]}; sets differ between the calls: {differ}")


def on_gpu(repeat: int) -> None:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    twice(TopkSpec(name="random-k512", rows=4, width=1536, k=512), "cuda")
    for case in gpu_cases("cuda"):
        repeated(case, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--repeat", type=int, default=50, help="calls per case on the GPU")
    args = parser.parse_args()
    if args.device == "cuda":
        on_gpu(args.repeat)
    else:
        on_cpu()


if __name__ == "__main__":
    main()
