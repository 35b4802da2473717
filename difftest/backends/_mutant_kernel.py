"""The Triton kernel behind difftest.backends.mutants: one readable paged MQA logits kernel whose bugs are switches.

This file holds @triton.jit functions and their constexpr constants only:
difftest.core.triton_interpret.load_kernel_module executes it once per mode (interpreted on the CPU, compiled
on a GPU). MUTATION picks the bug at compile time; NONE is the correct kernel. The constants below must equal
difftest.backends.mutants.Mutation (a test checks that they do).

The correct kernel, DeepGEMM's interface: q fp8 e4m3fn [B, next_n, H, D], the block-split cache (per block,
block_size * D key bytes then block_size fp32 scales), weights fp32 [rows, H], the per-row limits int32 [B, next_n]
and the block table int32 [B, W]; it writes every position of logits fp32 [rows, max_model_len] (-inf past each
row's window). Each row's width is cut into TILE-position tiles and the tiles into SPLITS contiguous ranges, one
program each. Programs are numbered split-major (every row's first range before any row's second), so a store that
spills past a row lands after that row's neighbour wrote its own first tiles, on the GPU as in the interpreter,
which runs the programs in order. A tile: per position its block id through the table, the key bytes and scale
(gathered, so any block size works), then per group of HG heads one (HG, D) x (D, TILE) product in fp32 (each fp8
product exact), ReLU, the weights, the head sum, the scale, -inf outside the window.
"""

from __future__ import annotations

import triton
import triton.language as tl

# difftest.backends.mutants.Mutation, restated: a jit function may read no other kind of global.
NONE = tl.constexpr(0)
MIRRORED_WINDOW = tl.constexpr(1)  # row j takes row next_n - 1 - j's limit
WINDOW_PAST_END = tl.constexpr(2)  # one key past every limit
LENGTHS_PER_SEQUENCE = tl.constexpr(3)  # the [B, next_n] table read as one length per sequence
AFTER_EMPTY = tl.constexpr(4)  # a request after an empty one scored with the empty one's q and weights
SPLIT_FLOOR = tl.constexpr(5)  # tiles per split rounded down: the last tiles of a row never written
PARTIAL_TILE_DROPPED = tl.constexpr(6)  # a tile the window ends inside is left -inf
PARTIAL_TILE_OVER_READ = tl.constexpr(7)  # a tile the window ends inside is scored to its end
POOL_OFFSET_INT32 = tl.constexpr(8)  # block id * bytes per block in int32
ROW_OFFSET_INT32 = tl.constexpr(9)  # row * max_model_len in int32
POSITION_OFFSET_INT32 = tl.constexpr(10)  # row * max_model_len + position, all in int32
POSITIONS_INT16 = tl.constexpr(11)  # key positions held in int16
HEAD_GROUP_WEIGHTS = tl.constexpr(12)  # every head group weighted with the first group's weights
FP8_FNUZ = tl.constexpr(13)  # fp8 bytes decoded as e4m3fnuz (half the e4m3fn value)
TOKEN_INTERLEAVED = tl.constexpr(14)  # the block-split cache read as token-interleaved
STALE_COLUMN = tl.constexpr(15)  # each sequence's last block read from the table column after it
STORE_PAST_ROW = tl.constexpr(16)  # a split's range not clamped to the row: its tiles stored past it
ROTATED_HEAD_SUM = tl.constexpr(17)  # correct, but each launch sums the heads from another starting head


# Sizes that change from case to case are plain arguments, not specialised on: one compiled kernel per
# (H, D, TILE, MUTATION), where specialising on them compiled a variant per divisible-by-16 pattern.
@triton.jit(do_not_specialize=["next_n", "block_size", "table_stride", "table_width", "num_blocks", "max_model_len",
                               "rows", "rotation"])
def paged_logits(q_ptr, kv_ptr, scale_ptr, w_ptr, lens_ptr, table_ptr, out_ptr, next_n, block_size, table_stride,
                 table_width, num_blocks, max_model_len, rows, rotation,
                 H: tl.constexpr, D: tl.constexpr, TILE: tl.constexpr, SPLITS: tl.constexpr, HG: tl.constexpr,
                 MUTATION: tl.constexpr):
    """Split `pid // rows` of row `pid % rows`: its range of tiles of [0, max_model_len), all written.

    kv_ptr and scale_ptr are the cache as bytes and as float32 (one buffer); `rotation` only moves the
    head-sum order of ROTATED_HEAD_SUM.
    """
    pid = tl.program_id(0)
    split = pid // rows
    row = pid % rows
    seq = row // next_n
    limit = _row_limit(lens_ptr, row, seq, next_n, MUTATION)
    q_row = _query_row(lens_ptr, row, seq, next_n, MUTATION)
    tiles = tl.cdiv(max_model_len, TILE)
    if MUTATION == SPLIT_FLOOR:
        per_split = tiles // SPLITS
    else:
        per_split = tl.cdiv(tiles, SPLITS)
    first = split * per_split
    if MUTATION == STORE_PAST_ROW:
        last = first + per_split
    else:
        last = tl.minimum(first + per_split, tiles)
    seq_len = tl.load(lens_ptr + seq * next_n + next_n - 1)  # the request's length: its last row's limit
    for tile in range(first, last):
        positions = tile * TILE + tl.arange(0, TILE)
        logits = tl.full([TILE], float("-inf"), tl.float32)
        if MUTATION == PARTIAL_TILE_DROPPED:
            scored = (tile + 1) * TILE <= limit
        else:
            scored = tile * TILE < limit
        if scored:
            logits = _tile_logits(q_ptr, kv_ptr, scale_ptr, w_ptr, table_ptr, seq, q_row, positions, limit, seq_len,
                                  block_size, table_stride, table_width, num_blocks, rotation, H, D, TILE, HG,
                                  MUTATION)
        _store(out_ptr, row, positions, logits, max_model_len, MUTATION)


@triton.jit
def _row_limit(lens_ptr, row, seq, next_n, MUTATION: tl.constexpr):
    """How many leading keys row `row` (draft row row % next_n of request `seq`) sees."""
    draft = row % next_n
    if MUTATION == MIRRORED_WINDOW:
        limit = tl.load(lens_ptr + seq * next_n + next_n - 1 - draft)
    elif MUTATION == LENGTHS_PER_SEQUENCE:
        length = tl.load(lens_ptr + seq)  # entry `seq` of the flattened [B, next_n] table
        limit = tl.maximum(length - next_n + draft + 1, 0)
    else:
        limit = tl.load(lens_ptr + row)
    if MUTATION == WINDOW_PAST_END:
        limit = limit + 1
    return limit


@triton.jit
def _query_row(lens_ptr, row, seq, next_n, MUTATION: tl.constexpr):
    """The row whose q and weights score row `row`: itself (AFTER_EMPTY: the previous request's, when it is empty)."""
    if MUTATION == AFTER_EMPTY:
        before = tl.load(lens_ptr + tl.maximum(seq * next_n - 1, 0))  # the previous request's length
        return tl.where((seq > 0) & (before == 0), row - next_n, row)
    return row


@triton.jit
def _tile_logits(q_ptr, kv_ptr, scale_ptr, w_ptr, table_ptr, seq, q_row, positions, limit, seq_len, block_size,
                 table_stride, table_width, num_blocks, rotation, H: tl.constexpr, D: tl.constexpr,
                 TILE: tl.constexpr, HG: tl.constexpr, MUTATION: tl.constexpr):
    """Logits of one tile of positions of one row, -inf outside its window."""
    if MUTATION == PARTIAL_TILE_OVER_READ:
        visible = positions < tl.cdiv(limit, TILE) * TILE
    elif MUTATION == POSITIONS_INT16:
        visible = positions.to(tl.int16) < limit
    else:
        visible = positions < limit
    keys, scales = _keys(kv_ptr, scale_ptr, table_ptr, seq, positions, visible, seq_len, block_size, table_stride,
                         table_width, num_blocks, D, MUTATION)
    acc = tl.zeros([TILE], dtype=tl.float32)
    for group in tl.static_range(H // HG):
        heads = group * HG + tl.arange(0, HG)
        if MUTATION == ROTATED_HEAD_SUM:
            heads = group * HG + (tl.arange(0, HG) + rotation) % HG
        q = _decoded(tl.load(q_ptr + q_row.to(tl.int64) * (H * D) + heads[:, None] * D + tl.arange(0, D)[None, :]),
                     MUTATION)
        if MUTATION == HEAD_GROUP_WEIGHTS:
            weights = tl.load(w_ptr + q_row.to(tl.int64) * H + heads % HG)
        else:
            weights = tl.load(w_ptr + q_row.to(tl.int64) * H + heads)
        # ieee: products of fp8 values are exact in fp32, where the default tf32 would round the inputs.
        scores = tl.maximum(tl.dot(q, tl.trans(keys), input_precision="ieee"), 0.0)  # (HG, TILE)
        acc += tl.sum(scores * weights[:, None], axis=0)
    return tl.where(visible, acc * scales, float("-inf"))


@triton.jit
def _keys(kv_ptr, scale_ptr, table_ptr, seq, positions, visible, seq_len, block_size, table_stride, table_width,
          num_blocks, D: tl.constexpr, MUTATION: tl.constexpr):
    """Keys (TILE, D) fp32 and scales (TILE,) of the visible positions (0 elsewhere), through the block table.

    Every table read stays inside the table and every block id inside the pool, whatever a mutation does
    to the position: a stray read is the mutant's bug, never this process's memory (the interpreter's).
    """
    if MUTATION == POSITIONS_INT16:
        narrow = positions.to(tl.int16)
        column = (narrow // block_size).to(tl.int32)
        slot = (narrow % block_size).to(tl.int32)
    else:
        column = positions // block_size
        slot = positions % block_size
    if MUTATION == STALE_COLUMN:
        last_used = (seq_len - 1) // block_size
        column = tl.where(column == last_used, column + 1, column)
    inside = visible & (column >= 0) & (column < table_width)
    block = tl.load(table_ptr + seq.to(tl.int64) * table_stride + column, mask=inside, other=0)
    block = tl.minimum(tl.maximum(block, 0), num_blocks - 1)
    key_at, scale_at = _offsets(block, slot, block_size, D, MUTATION)
    raw = tl.load(kv_ptr + key_at[:, None] + tl.arange(0, D)[None, :], mask=visible[:, None], other=0)
    scales = tl.load(scale_ptr + scale_at, mask=visible, other=0.0)
    return _decoded(raw, MUTATION), scales


@triton.jit
def _offsets(block, slot, block_size, D: tl.constexpr, MUTATION: tl.constexpr):
    """Byte offset of each position's key and float32 index of its scale in the cache."""
    if MUTATION == TOKEN_INTERLEAVED:  # per token: D key bytes, then its scale
        token = block.to(tl.int64) * block_size + slot
        return token * (D + 4), (token * (D + 4) + D) // 4
    if MUTATION == POOL_OFFSET_INT32:
        base = block * (block_size * (D + 4))  # int32: wraps past 2^31 bytes
    else:
        base = block.to(tl.int64) * (block_size * (D + 4))
    return base + slot * D, (base + block_size * D) // 4 + slot


@triton.jit
def _decoded(raw, MUTATION: tl.constexpr):
    """fp32 values of e4m3fn bytes (FP8_FNUZ: as e4m3fnuz reads them, half the value)."""
    values = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    if MUTATION == FP8_FNUZ:
        values = values * 0.5
    return values


@triton.jit
def _store(out_ptr, row, positions, logits, max_model_len, MUTATION: tl.constexpr):
    """Row `row`'s tile at `positions`, bounded by the row (STORE_PAST_ROW: not)."""
    if MUTATION == ROW_OFFSET_INT32:
        offsets = (row * max_model_len).to(tl.int64) + positions
    elif MUTATION == POSITION_OFFSET_INT32:
        offsets = row * max_model_len + positions
    else:
        offsets = row.to(tl.int64) * max_model_len + positions
    if MUTATION == STORE_PAST_ROW:
        tl.store(out_ptr + offsets, logits)
    else:
        tl.store(out_ptr + offsets, logits, mask=positions < max_model_len)
