"""Triton kernel of the fused ragged MQA logits oracle (difftest/oracles/fused_ragged.py launches it).

This file holds @triton.jit functions only and is executed once per mode by
difftest.core.triton_interpret.load_kernel_module (interpreted on the CPU, compiled on a GPU). decode_fp8 and
_fold are the paged oracle's (difftest/oracles/_paged_mqa_logits_kernel.py): that file is loaded here in this
file's own mode (load_kernel_module sets TRITON_INTERPRET while it executes a kernel file), since a jit
function calls jit functions of its own mode.

logits_kernel runs one program per (block of BLOCK_M query rows, chunk of keys), as DeepGEMM's sm90 kernel
cuts its work: a block reads the keys [least k_start, greatest k_end) of its rows once for all of them. Its
prologue decodes the block's q into one fp16 (D, BLOCK_M * H) tile and folds sum_h |w| * |q| per row for the
bound. Per tile of BLOCK_N keys: decode fp8 -> fp16 (exact), one tensor-core product with folded^T for the
bound and one with q^T for the scores, then ReLU, weights, head sum and scale in registers, and each row's
positions inside its window stored at their window-relative column.
"""

from __future__ import annotations

import os
from pathlib import Path

import triton
import triton.language as tl

from difftest.core.triton_interpret import load_kernel_module

_PAGED = load_kernel_module(Path(__file__).with_name("_paged_mqa_logits_kernel.py"), "difftest_fused_oracle",
                            os.environ.get("TRITON_INTERPRET") == "1")
decode_fp8 = _PAGED.decode_fp8
_fold = _PAGED._fold


# The buffer's size, the rows and the output's width change from case to case and only feed scalar index
# arithmetic: not specialised on (Triton otherwise compiles a variant per divisible-by-16 pattern of them).
@triton.jit(do_not_specialize=["rows", "keys", "width", "chunk"])
def logits_kernel(q_ptr, k_src, s_src, w_ptr, starts_ptr, ends_ptr, out_ptr, peak_ptr, rows, keys, width, chunk,
                  H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr,
                  NF: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, FNUZ: tl.constexpr,
                  FIX_NAN: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Logits of keys [lo + chunk * c, lo + chunk * (c + 1)) for the rows of block b, stored window-relative.

    lo is the block's least k_start rounded down to a multiple of BLOCK_N, so tiles start aligned (the bulk
    tensor copies of TMA take them whole). k_src, s_src: tensor descriptors of the keys (keys, D) and scales
    (keys,) when TMA, else plain pointers. Windows end at most `width` keys past their start (the output's
    columns). peak_ptr (rows,) holds the bits of a float32 (>= 0), raised by atomic max to this chunk's
    largest (folded . |k_p|) * s_p over each row's window (folded rounded up, see _fold).
    """
    first = tl.program_id(0) * BLOCK_M
    lanes = tl.arange(0, BLOCK_M)
    starts, ends = _windows(starts_ptr, ends_ptr, first + lanes, rows, width)
    lo = tl.min(tl.where(ends > starts, starts, keys)) // BLOCK_N * BLOCK_N
    hi = tl.max(tl.where(ends > starts, ends, 0))
    start = lo + tl.program_id(1) * chunk
    stop = tl.minimum(start + chunk, hi)

    q_t, weights = _load_queries(q_ptr, w_ptr, first, rows, H, D, BLOCK_M, H_PAD, D_PAD, FNUZ, FIX_NAN)
    folded_t, unscale = _fold(q_t, weights, D_PAD, BLOCK_M, H_PAD, NF)
    bound_cols = tl.arange(0, NF)
    bound_starts, bound_ends = _windows(starts_ptr, ends_ptr, tl.where(bound_cols < BLOCK_M, first + bound_cols, rows),
                                        rows, width)
    rows_64 = (first + lanes).to(tl.int64)
    peak = tl.zeros([BLOCK_N, NF], dtype=tl.float32)  # a running maximum per slot of the tile, reduced after the loop
    dims = tl.arange(0, D_PAD)
    for p0 in tl.range(start, stop, BLOCK_N, num_stages=NUM_STAGES):
        pos = p0 + tl.arange(0, BLOCK_N)
        if TMA:  # rows past the buffer's end come back as zeros
            keys_tile = decode_fp8(k_src.load([p0, 0]), FNUZ, FIX_NAN)
            scales = s_src.load([p0])
        else:
            live = pos < keys
            # int64 offsets: key index * D passes 2^31 in a buffer of more than 2 GiB of keys.
            raw = tl.load(k_src + pos[:, None].to(tl.int64) * D + dims[None, :],
                          mask=live[:, None] & (dims[None, :] < D), other=0)
            keys_tile = decode_fp8(raw, FNUZ, FIX_NAN)
            scales = tl.load(s_src + pos, mask=live, other=0.0)
        # The bound's product first: |k|'s registers are free before the scores' accumulator is live.
        magnitude = tl.dot(tl.abs(keys_tile), folded_t) * scales[:, None]  # (BLOCK_N, NF)
        in_bound = (pos[:, None] >= bound_starts[None, :]) & (pos[:, None] < bound_ends[None, :])
        peak = tl.maximum(peak, tl.where(in_bound, magnitude, 0.0))  # where, not a product: NaN canaries stay out
        scores = tl.dot(keys_tile, q_t)  # (BLOCK_N, BLOCK_M * H_PAD) fp32; fp16 products are exact
        # A ReLU that keeps NaN, as torch's does: plain max.f32 would turn a NaN score into 0.
        scores = tl.maximum(scores, 0.0, propagate_nan=tl.PropagateNan.ALL) * weights[None, :]
        logits = tl.sum(tl.reshape(scores, [BLOCK_N, BLOCK_M, H_PAD]), axis=2) * scales[:, None]
        inside = (pos[:, None] >= starts[None, :]) & (pos[:, None] < ends[None, :])
        offsets = rows_64[None, :] * width + (pos[:, None] - starts[None, :])
        tl.store(out_ptr + offsets, logits, mask=inside)
    # Undo _fold's power-of-two scaling (exact), then raise each row's peak. Non-negative float32 values
    # order like their int32 bits, so an integer atomic max is exact and order-free.
    peak = tl.max(peak, axis=0) * unscale
    tl.atomic_max(peak_ptr + first + bound_cols, peak.to(tl.int32, bitcast=True),
                  mask=(bound_cols < BLOCK_M) & (first + bound_cols < rows))


@triton.jit
def _windows(starts_ptr, ends_ptr, row, rows, width):
    """int32 (start, end) of each row in `row`, the end at most `width` keys past the start; [0, 0) past `rows`."""
    real = row < rows
    starts = tl.load(starts_ptr + row, mask=real, other=0)
    ends = tl.load(ends_ptr + row, mask=real, other=0)
    return starts, tl.minimum(ends, starts + width)


@triton.jit
def _load_queries(q_ptr, w_ptr, first, rows, H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                  H_PAD: tl.constexpr, D_PAD: tl.constexpr, FNUZ: tl.constexpr, FIX_NAN: tl.constexpr):
    """q^T (D_PAD, BLOCK_M * H_PAD) fp16 and weights (BLOCK_M * H_PAD,) fp32 of rows [first, first + BLOCK_M).

    Column j * H_PAD + h is head h of row first + j; padding columns and rows past `rows` hold zeros.
    """
    cols = tl.arange(0, BLOCK_M * H_PAD)
    row = first + cols // H_PAD
    head = cols % H_PAD
    real = (row < rows) & (head < H)
    flat = row.to(tl.int64) * H + head  # (row, head) index into weights
    weights = tl.load(w_ptr + flat, mask=real, other=0.0)
    dims = tl.arange(0, D_PAD)
    raw = tl.load(q_ptr + flat[None, :] * D + dims[:, None], mask=real[None, :] & (dims[:, None] < D), other=0)
    return decode_fp8(raw, FNUZ, FIX_NAN), weights
