"""Triton kernel of the fused paged MQA logits oracle (difftest/oracles/fused.py launches it).

This file holds @triton.jit functions only: difftest.core.triton_interpret.load_kernel_module executes it
once per mode (interpreted on the CPU, compiled on a GPU), so nothing here depends on the mode
except through the constexpr arguments the host passes.

logits_kernel runs one program per (sequence, chunk of key positions) and computes every next_n
row and every head of that sequence, so each key byte is read from memory once. Its prologue
decodes the sequence's q into one fp16 (D, next_n * H) tile and folds sum_h |w| * |q| for the
bound. Per tile of BLOCK_P keys: gather through the block table, decode fp8 -> fp16 (exact), one
tensor-core product with folded^T for the bound and one with q^T for the scores, then ReLU,
weights, head sum, scale and the causal -inf mask in registers.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def decode_fp8(raw, FNUZ: tl.constexpr, FIX_NAN: tl.constexpr):
    """fp16 values of e4m3fn (FNUZ False) or e4m3fnuz (FNUZ True) bytes; exact for every byte.

    fp16 holds every e4m3 value exactly (5 exponent bits cover 2^-10 .. 448), and the hardware
    converts e4m3fn pairs to fp16 in one instruction (bf16 would need a detour through fp32).
    e4m3fnuz has the same bit fields with bias 8 instead of 7, so its value is half the e4m3fn
    value of the same byte, except 0x80 (fnuz NaN, fn -0) and 0x7f/0xff (fnuz +-240, fn NaN).
    The Triton interpreter decodes the e4m3fn NaN bytes as +-480; FIX_NAN restores NaN there.
    """
    value = raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    top = (raw & 0x7F) == 0x7F
    if FNUZ:
        value = value * 0.5
        value = tl.where(top, tl.where(raw >= 0x80, -240.0, 240.0).to(tl.float16), value)
        value = tl.where(raw == 0x80, float("nan"), value).to(tl.float16)
    elif FIX_NAN:
        value = tl.where(top, float("nan"), value).to(tl.float16)
    return value


# The table's width and the pool's size change from case to case and only feed scalar index arithmetic:
# not specialised on (Triton otherwise compiles a variant per divisible-by-16 pattern of them, ~0.5 s
# each, a new one every few cases of a fuzz campaign).
@triton.jit(do_not_specialize=["table_stride", "num_blocks", "chunks"])
def logits_kernel(q_ptr, k_src, s_src, w_ptr, table_ptr, lens_ptr, out_ptr, peak_ptr,
                  table_stride, max_model_len, num_blocks, chunk, chunks,
                  NEXT_N: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                  NEXT_N_PAD: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, NF: tl.constexpr,
                  BLOCK_P: tl.constexpr, TMA: tl.constexpr, FNUZ: tl.constexpr, FIX_NAN: tl.constexpr,
                  NUM_STAGES: tl.constexpr, IDS: tl.constexpr):
    """Logits of positions [chunk * c, chunk * (c + 1)) of sequence b, all rows; -inf outside each window.

    k_src, s_src: tensor descriptors of the pool as (num_blocks * BS, D) keys and (num_blocks * BS,)
    scales when TMA (each tile lies inside one block), else plain pointers to them.
    peak_ptr (rows,) holds the bits of a float32 (>= 0), raised by atomic max to this chunk's largest
    (folded . |k_p|) * s_p over p < limit of each row (computed from folded rounded up, see _fold).
    IDS: a power of two >= the tiles of a chunk (the TMA sweep holds the chunk's block ids in registers).
    The grid is one-dimensional, `chunks` programs per sequence in a row: a second grid axis would cap the
    batch at 65535 sequences, which the 2^32-byte q cases pass.
    """
    seq = tl.program_id(0) // chunks
    seq_len = tl.load(lens_ptr + seq).to(tl.int32)
    visible = tl.minimum(seq_len, max_model_len)
    start = (tl.program_id(0) % chunks) * chunk
    stop = tl.minimum(start + chunk, max_model_len)
    compute_stop = tl.minimum(stop, visible)

    drafts = tl.arange(0, NEXT_N_PAD)
    rows = seq.to(tl.int64) * NEXT_N + drafts
    q_t, weights = _load_queries(q_ptr, w_ptr, seq, NEXT_N, H, D, NEXT_N_PAD, H_PAD, D_PAD, FNUZ, FIX_NAN)
    folded_t, unscale = _fold(q_t, weights, D_PAD, NEXT_N_PAD, H_PAD, NF)
    sweep = (q_t, weights, folded_t, seq_len, rows, out_ptr, stop, max_model_len)
    if TMA:
        peak = _sweep_tiles_tma(k_src, s_src, table_ptr, seq, table_stride, num_blocks, visible, start,
                                compute_stop, sweep, NEXT_N, BS, NEXT_N_PAD, H_PAD, NF, BLOCK_P, FNUZ,
                                FIX_NAN, NUM_STAGES, IDS)
    else:
        peak = _sweep_tiles_gather(k_src, s_src, table_ptr, seq, table_stride, num_blocks, visible, start,
                                   compute_stop, sweep, NEXT_N, D, BS, NEXT_N_PAD, H_PAD, D_PAD, NF, BLOCK_P,
                                   FNUZ, FIX_NAN, NUM_STAGES)

    fill_from = start + tl.cdiv(tl.maximum(compute_stop - start, 0), BLOCK_P) * BLOCK_P
    for p0 in range(fill_from, stop, BLOCK_P):
        empty = tl.full([BLOCK_P, NEXT_N_PAD], float("-inf"), dtype=tl.float32)
        _store_rows(out_ptr, rows, p0 + tl.arange(0, BLOCK_P), empty, stop, max_model_len, NEXT_N, NEXT_N_PAD)
    # Undo _fold's power-of-two scaling (exact), then raise each row's peak. Non-negative float32
    # values order like their int32 bits, so an integer atomic max is exact and order-free.
    peak = peak * unscale
    bound_cols = tl.arange(0, NF)
    tl.atomic_max(peak_ptr + seq.to(tl.int64) * NEXT_N + bound_cols, peak.to(tl.int32, bitcast=True),
                  mask=bound_cols < NEXT_N)


@triton.jit
def _sweep_tiles_tma(k_desc, s_desc, table_ptr, seq, table_stride, num_blocks, visible, start, compute_stop,
                     sweep, NEXT_N: tl.constexpr, BS: tl.constexpr, NEXT_N_PAD: tl.constexpr,
                     H_PAD: tl.constexpr, NF: tl.constexpr, BLOCK_P: tl.constexpr, FNUZ: tl.constexpr,
                     FIX_NAN: tl.constexpr, NUM_STAGES: tl.constexpr, IDS: tl.constexpr):
    """Tiles that each lie inside one block: one id per tile, keys and scales by bulk tensor copies.

    The chunk's block ids are loaded once, before the loop, and each tile picks its own from registers:
    with no load between the loop counter and a tile's copy, Triton's pipeliner issues the copies
    NUM_STAGES - 1 tiles ahead (an id loaded from memory in the loop, in this or the previous
    iteration, left it waiting for each copy right after issuing it). A tile lies inside one block
    (BS is a multiple of BLOCK_P), so a chunk touches at most as many blocks as it has tiles (<= IDS).
    A tile that straddles the sequence's end also reads the slots past it (NaN canaries); those rows
    stay in their own rows of both products and are replaced by -inf / 0 in _score_tile.
    """
    peak = tl.zeros([BLOCK_P, NF], dtype=tl.float32)  # _score_tile's running maximum, per slot of the tile
    first_block = start // BS
    slots = tl.arange(0, IDS)
    ids = _table_entry(table_ptr, seq, table_stride, (first_block + slots) * BS, visible, num_blocks, BS)
    for p0 in tl.range(start, compute_stop, BLOCK_P, num_stages=NUM_STAGES):
        block = tl.sum(tl.where(slots == p0 // BS - first_block, ids, 0))
        first = (block * BS + p0 % BS).to(tl.int32)
        keys = decode_fp8(k_desc.load([first, 0]), FNUZ, FIX_NAN)
        scales = s_desc.load([first])
        peak = _score_tile(keys, scales, p0 + tl.arange(0, BLOCK_P), peak, sweep, NEXT_N, NEXT_N_PAD, H_PAD,
                           NF, BLOCK_P)
    return tl.max(peak, axis=0)


# The gather sweep reads a tile's block ids one tile ahead, as a loop-carried value, so the gather
# loads of tile i depend only on what iteration i - 1 loaded. Only positions below the sequence
# length are ever looked up in the table, and ids are clamped into the pool (both sweeps): NaN
# canaries past the last token and stale columns cannot reach any value.

@triton.jit
def _sweep_tiles_gather(k_ptr, s_ptr, table_ptr, seq, table_stride, num_blocks, visible, start, compute_stop,
                        sweep, NEXT_N: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                        NEXT_N_PAD: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, NF: tl.constexpr,
                        BLOCK_P: tl.constexpr, FNUZ: tl.constexpr, FIX_NAN: tl.constexpr,
                        NUM_STAGES: tl.constexpr):
    """Any block size: one id per position, keys and scales by masked gathers (0 past the end)."""
    peak = tl.zeros([BLOCK_P, NF], dtype=tl.float32)  # _score_tile's running maximum, per slot of the tile
    lanes = tl.arange(0, BLOCK_P)
    dims = tl.arange(0, D_PAD)
    blocks = _table_entry(table_ptr, seq, table_stride, start + lanes, visible, num_blocks, BS)
    for p0 in tl.range(start, compute_stop, BLOCK_P, num_stages=NUM_STAGES):
        pos = p0 + lanes
        live = pos < visible
        slots = blocks.to(tl.int64) * BS + pos % BS  # int64: slot * D passes 2^31 in big pools
        blocks = _table_entry(table_ptr, seq, table_stride, pos + BLOCK_P, visible, num_blocks, BS)
        scales = tl.load(s_ptr + slots, mask=live, other=0.0)
        if D_PAD == D:  # a mask constant along D keeps the loads 16 bytes wide
            mask = live[:, None]
        else:
            mask = live[:, None] & (dims[None, :] < D)
        raw = tl.load(k_ptr + slots[:, None] * D + dims[None, :], mask=mask, other=0)
        peak = _score_tile(decode_fp8(raw, FNUZ, FIX_NAN), scales, pos, peak, sweep, NEXT_N, NEXT_N_PAD,
                           H_PAD, NF, BLOCK_P)
    return tl.max(peak, axis=0)


@triton.jit
def _table_entry(table_ptr, seq, table_stride, pos, visible, num_blocks, BS: tl.constexpr):
    """Block id(s) holding position(s) pos of seq: 0 where pos >= visible (nothing read), clamped."""
    block = tl.load(table_ptr + seq.to(tl.int64) * table_stride + pos // BS, mask=pos < visible, other=0)
    return tl.minimum(tl.maximum(block, 0), num_blocks - 1)


@triton.jit
def _score_tile(keys, scales, pos, peak, sweep, NEXT_N: tl.constexpr, NEXT_N_PAD: tl.constexpr,
                H_PAD: tl.constexpr, NF: tl.constexpr, BLOCK_P: tl.constexpr):
    """Store one tile's logits of every row; return the bound's running peak (BLOCK_P, NF) raised by this tile.

    Two choices keep the loop short on Hopper (H200, B 40, next_n 2, 120K: 0.383 -> 0.348 ms together,
    bench/README.md). The bound's product comes first: |k|'s registers are free before the scores'
    accumulator is live, so at 168 registers (3 programs an SM) the loop does not spill. And the peak is
    kept per slot of the tile, a maximum in registers, reduced over the tile's positions once after the
    loop (the sweeps): a reduction per tile crosses the program's four warps through shared memory, with
    three barriers a tile. A maximum is exact in any order: the bound is the same.
    """
    q_t, weights, folded_t, seq_len, rows, out_ptr, stop, max_model_len = sweep
    cols = tl.arange(0, NF)
    bound_limits = tl.where(cols < NEXT_N, tl.maximum(seq_len - NEXT_N + 1 + cols, 0), 0)
    magnitude = tl.dot(tl.abs(keys), folded_t) * scales[:, None]  # (BLOCK_P, NF)
    magnitude = tl.where(pos[:, None] < bound_limits[None, :], magnitude, 0.0)
    drafts = tl.arange(0, NEXT_N_PAD)
    limits = tl.maximum(seq_len - NEXT_N + 1 + drafts, 0)  # causal limit of each row
    scores = tl.dot(keys, q_t)  # (BLOCK_P, NEXT_N_PAD * H_PAD) fp32; fp16 products are exact
    # A ReLU that keeps NaN, as torch's does: plain max.f32 would turn a NaN score into 0.
    scores = tl.maximum(scores, 0.0, propagate_nan=tl.PropagateNan.ALL) * weights[None, :]
    logits = tl.sum(tl.reshape(scores, [BLOCK_P, NEXT_N_PAD, H_PAD]), axis=2) * scales[:, None]
    logits = tl.where(pos[:, None] < limits[None, :], logits, float("-inf"))
    _store_rows(out_ptr, rows, pos, logits, stop, max_model_len, NEXT_N, NEXT_N_PAD)
    return tl.maximum(peak, magnitude)


@triton.jit
def _load_queries(q_ptr, w_ptr, seq, NEXT_N: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
                  NEXT_N_PAD: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr,
                  FNUZ: tl.constexpr, FIX_NAN: tl.constexpr):
    """q^T (D_PAD, NEXT_N_PAD * H_PAD) fp16 and weights (NEXT_N_PAD * H_PAD,) fp32 of one sequence.

    Column j * H_PAD + h is head h of draft row j; padding columns hold zeros (they add nothing).
    """
    cols = tl.arange(0, NEXT_N_PAD * H_PAD)
    draft = cols // H_PAD
    head = cols % H_PAD
    real = (draft < NEXT_N) & (head < H)
    flat = (seq.to(tl.int64) * NEXT_N + draft) * H + head  # (row, head) index into weights
    weights = tl.load(w_ptr + flat, mask=real, other=0.0)
    dims = tl.arange(0, D_PAD)
    raw = tl.load(q_ptr + flat[None, :] * D + dims[:, None], mask=real[None, :] & (dims[:, None] < D), other=0)
    return decode_fp8(raw, FNUZ, FIX_NAN), weights


@triton.jit
def _fold(q_t, weights, D_PAD: tl.constexpr, NEXT_N_PAD: tl.constexpr, H_PAD: tl.constexpr, NF: tl.constexpr):
    """folded^T (D_PAD, NF) fp16, column j = 2^shift[j] * sum_h |w| |q| of draft row j, and (NF,) 2^-shift.

    The sum is fp32; the scaling puts each column's largest entry in [2^14, 2^15), so fp16 neither
    overflows nor loses much to underflow, and the fp16 values are rounded *up*, so the bound's
    tensor-core product never starts from less than the fp32 folded vector. shift stays in
    [-113, 126], so 2^shift and 2^-shift are both normal floats and the scalings are exact.
    """
    terms = tl.abs(q_t.to(tl.float32)) * tl.abs(weights)[None, :]
    folded = tl.sum(tl.reshape(terms, [D_PAD, NEXT_N_PAD, H_PAD]), axis=2)  # (D_PAD, NEXT_N_PAD) >= 0
    # The exponent comes from the float's bits (no log2 rounding); 2^shift is built the same way.
    top = tl.max(folded, axis=0)
    exponent = ((top.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    shifts = tl.minimum(14 - exponent, 126)
    scaled = folded * ((shifts + 127) << 23).to(tl.float32, bitcast=True)[None, :]
    # Widen to NF columns (tl.dot needs N >= 16) by an exact 0/1 selection.
    select = tl.arange(0, NEXT_N_PAD)[:, None] == tl.arange(0, NF)[None, :]
    wide = tl.sum(tl.where(select[None, :, :], scaled[:, :, None], 0.0), axis=1)  # (D_PAD, NF)
    unscale = ((127 - shifts) << 23).to(tl.float32, bitcast=True)
    unscale = tl.sum(tl.where(select, unscale[:, None], 0.0), axis=0)  # (NF,); 0 past NEXT_N_PAD
    half = wide.to(tl.float16)
    # Round up: where round-to-nearest went down, take the next fp16 (positive, so bits + 1).
    up = (half.to(tl.int16, bitcast=True) + 1).to(tl.int16).to(tl.float16, bitcast=True)
    return tl.where(half.to(tl.float32) < wide, up, half), unscale


@triton.jit
def _store_rows(out_ptr, rows, pos, values, stop, max_model_len, NEXT_N: tl.constexpr,
                NEXT_N_PAD: tl.constexpr):
    """values (BLOCK_P, NEXT_N_PAD) into out[rows[j], pos[i]] for real rows and pos < stop."""
    offsets = rows[None, :] * max_model_len + pos[:, None]
    mask = (pos[:, None] < stop) & (tl.arange(0, NEXT_N_PAD)[None, :] < NEXT_N)
    tl.store(out_ptr + offsets, values, mask=mask)

