"""Ragged (prefill) logits mutants for `difftest selftest`: a correct, readable ragged MQA logits kernel in torch
and a copy of it per bug class, each switched on by a `RaggedMutation`.

The kernel keeps the contract of AITER's Triton ragged kernel (difftest.backends.aiter_ragged): ABSOLUTE logits
[rows, keys] float32, -inf in every column outside a row's window (its wrapper fills the output with -inf first),
128-key tiles. It cuts the work as a tiled GPU kernel does, so a tile bug is a line changed, not a rewrite:

* rows in q blocks of BLOCK_Q (only a mutant's bug sees the blocks: the correct kernel scores each row alone);
* each row's window [k_start, k_end) in TILE-key tiles counted from k_start, as many as the window needs; every
  row's tile t is computed in the same step (rows a chunk at a time, so a 128K-key prefill fits in memory);
* per tile: the keys' fp8 bytes gathered and decoded to float32 (exact), one (H, D) x (D, TILE) product per
  row in float32 (each fp8 product exact), ReLU, the weights, the head sum, then the key scale; stored where
  the tile lies inside the window. A read outside the key buffer finds NaN, as difftest's guard rows make it
  for a Triton kernel; a store outside the row lands, through the flat address row * keys + column, in the
  rows after it (applied after every row's own stores, as when the programs run last to first, an order a GPU
  may take) or is dropped past the output.

Every mutant keeps the correct kernel's contract, so one plan (difftest.generators.ragged.ragged_plan) and one
oracle judge them all. Two must pass: the correct kernel, and one that sums the heads from another starting
head on every launch (bits move, always within tolerance). Two need production scale: the 32-bit key offset
(key index * D past 2^31 bytes) and the 32-bit row offset (row * keys past 2^31 logits); the wrap is emulated in
the index arithmetic, so below those sizes they are the correct kernel.
"""

from __future__ import annotations

import enum
import itertools
import math

import torch

from difftest.core import hardware
from difftest.core.fp8 import decode
from difftest.core.kinds import Fp8Flavour, LogitsForm, MaskConvention
from difftest.core.ragged import RaggedContract, RaggedInputs, RaggedTiles

TILE = 128  # keys per tile: AITER's BLOCK_KV
BLOCK_Q = 4  # query rows per q block
HEAD_GROUP = 32  # heads per product: a kernel written for 32 heads that loops over groups of them
ALIGN = 4  # DeepGEMM reads a q block's keys from its least k_start rounded down to a multiple of 4
TWO_31, TWO_32 = 2 ** 31, 2 ** 32
STEP_BYTES = 1 << 28  # float32 bytes of gathered keys per step: rows are taken this many at a time


class RaggedMutation(str, enum.Enum):
    """What a ragged mutant changes in the correct kernel."""

    NONE = "none"
    ROTATED_HEAD_SUM = "rotated-head-sum"  # right: each launch sums the heads from another starting head
    TILES_FROM_KEY_0 = "tiles-from-key-0"  # whole tiles run to k_end rounded down from key 0 (AITER 0.1.7)
    START_ALIGNED = "start-aligned"  # k_start rounded down to a multiple of ALIGN
    END_INCLUSIVE = "end-inclusive"  # k_end read as the window's last key: one key past every window
    BLOCK_FIRST_WINDOW = "block-first-window"  # every row of a q block scored over the block's first row's window
    PARTIAL_BLOCK_DROPPED = "partial-block-dropped"  # the rows past the last whole q block never scored
    EMPTY_WINDOW_KEY = "empty-window-key"  # an empty window still scores its first key
    BUFFER_END_UNMASKED = "buffer-end-unmasked"  # a window reaching the buffer's end stores its last tile whole
    SEQLEN_FLOOR = "max-seqlen-k-floor"  # tiles per row bounded by max_seqlen_k // TILE: long windows cut short
    HEAD_GROUP_WEIGHTS = "head-group-weights"  # every group of HEAD_GROUP heads weighted with the first group's
    FP8_FNUZ = "fp8-fnuz"  # e4m3fn key bytes decoded as e4m3fnuz (half the value; 0x80 NaN)
    KEY_OFFSET_INT32 = "key-offset-int32"  # key index * D in int32: wraps past 2^31 bytes of keys
    ROW_OFFSET_INT32 = "row-offset-int32"  # row * keys in int32: wraps past 2^31 logits


def contract() -> RaggedContract:
    """AITER's ragged contract with this kernel's tiling: ABSOLUTE, -inf outside each window, any heads and
    head dims, 128-key tiles, q blocks of BLOCK_Q rows (the planner's row-count and disjoint-block cases);
    rtol as AITER's fp32 kernel (the oracle's fp32 bound covers any summation order besides)."""
    return RaggedContract(form=LogitsForm.ABSOLUTE, mask=MaskConvention.TAIL_NEG_INF, rtol=1e-3,
                          tiles=RaggedTiles(kv=(TILE,), q_rows=BLOCK_Q),
                          library=f"difftest.backends.ragged_mutants (torch {torch.__version__})")


class RaggedMutant:
    """The ragged logits kernel with `mutation` planted, under contract()."""

    def __init__(self, mutation: RaggedMutation, name: str) -> None:
        self.mutation = mutation
        self.name = name
        self.contract = contract()
        self._launches = itertools.count()  # ROTATED_HEAD_SUM's start head moves on every launch

    def unavailable_reason(self, device: str) -> str | None:
        """None on the CPU; on 'cuda', why torch sees no GPU."""
        return hardware.cuda_unavailable_reason() if device == "cuda" else None

    def __call__(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [rows, keys] float32: -inf, then every tile step's stores, then the stores that left their row."""
        rotation = next(self._launches) if self.mutation == RaggedMutation.ROTATED_HEAD_SUM else 0
        logits = torch.full((inputs.rows * inputs.keys,), -math.inf, dtype=torch.float32, device=inputs.q.device)
        starts, ends = _windows(inputs, self.mutation)
        tiles = _tile_counts(starts, ends, inputs.rows, self.mutation)
        strays: list[tuple[torch.Tensor, torch.Tensor]] = []
        for step in range(int(tiles.max())):
            stored = _stored(starts, ends, tiles, step, inputs.keys, self.mutation)  # bool [rows, TILE]
            for rows in _row_chunks(stored.any(dim=1).nonzero().flatten(), inputs.q.shape[2]):
                positions = starts[rows, None] + step * TILE + torch.arange(TILE, device=starts.device)
                values = _tile(inputs, rows, positions, self.mutation, rotation)
                strays.append(_store(logits, rows, positions, values, stored[rows], inputs.keys, self.mutation))
        _store_strays(logits, strays)
        return logits.view(inputs.rows, inputs.keys)


# --------------------------------------------------------------------------- which keys, which stores

def _windows(inputs: RaggedInputs, mutation: RaggedMutation) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 [rows] starts and ends each row is scored over."""
    starts, ends = inputs.k_start.long(), inputs.k_end.long()
    if mutation == RaggedMutation.START_ALIGNED:
        return starts // ALIGN * ALIGN, ends
    if mutation == RaggedMutation.END_INCLUSIVE:
        return starts, ends + 1
    if mutation == RaggedMutation.EMPTY_WINDOW_KEY:
        return starts, torch.maximum(ends, starts + 1)
    if mutation == RaggedMutation.BLOCK_FIRST_WINDOW:
        first = torch.arange(inputs.rows, device=starts.device) // BLOCK_Q * BLOCK_Q
        return starts[first], ends[first]
    return starts, ends


def _tile_counts(starts: torch.Tensor, ends: torch.Tensor, rows: int, mutation: RaggedMutation) -> torch.Tensor:
    """int64 [rows]: the tiles each row runs (0 for a row no program scores)."""
    lens = ends - starts
    tiles = -(-lens // TILE)  # as many as the window needs
    if mutation == RaggedMutation.TILES_FROM_KEY_0:
        whole_end = ends // TILE * TILE  # whole tiles while below k_end rounded down, counted from key 0
        whole = -(-(whole_end - starts).clamp(min=0) // TILE)
        tiles = whole + (whole_end != ends).long()  # then one masked tail tile
    elif mutation == RaggedMutation.SEQLEN_FLOOR:
        max_seqlen_k = int(lens.max())  # as a caller computes it: the longest window
        tiles = tiles.clamp(max=max_seqlen_k // TILE)
    elif mutation == RaggedMutation.PARTIAL_BLOCK_DROPPED:
        tiles[rows // BLOCK_Q * BLOCK_Q:] = 0  # the grid covers whole q blocks only
    return tiles


def _stored(starts: torch.Tensor, ends: torch.Tensor, tiles: torch.Tensor, step: int, keys: int,
            mutation: RaggedMutation) -> torch.Tensor:
    """bool [rows, TILE]: which positions of each row's tile `step` (keys k_start + step * TILE + j) are stored."""
    offsets = step * TILE + torch.arange(TILE, device=starts.device)
    running = (step < tiles)[:, None]
    if mutation == RaggedMutation.TILES_FROM_KEY_0:
        # Whole tiles unmasked; the tail's mask is taken on offsets from k_end rounded down, while its loads
        # and stores sit where the whole tiles left the pointers (aiter _fp8_mqa_logits_kernel, 0.1.7).
        whole_end = ends // TILE * TILE
        tail = whole_end[:, None] + torch.arange(TILE, device=starts.device)
        in_tail = (tail >= starts[:, None]) & (tail < ends[:, None]) & (step == tiles - 1)[:, None]
        whole = (step < tiles - (whole_end != ends).long())[:, None]
        return running & (whole | in_tail)
    inside = starts[:, None] + offsets < ends[:, None]
    if mutation == RaggedMutation.BUFFER_END_UNMASKED:
        inside |= (ends == keys)[:, None]  # "the buffer's last tile needs no mask"
    return running & inside


def _row_chunks(rows: torch.Tensor, dim: int) -> list[torch.Tensor]:
    """The rows of a step, a number at a time whose gathered float32 keys stay within STEP_BYTES."""
    step = max(1, STEP_BYTES // (TILE * dim * 4))
    return list(rows.split(step))


# --------------------------------------------------------------------------- one tile

def _tile(inputs: RaggedInputs, rows: torch.Tensor, positions: torch.Tensor, mutation: RaggedMutation,
          rotation: int) -> torch.Tensor:
    """float32 [len(rows), TILE]: each row's logits of the keys at `positions` (NaN where a read leaves the
    buffer)."""
    heads = inputs.q.shape[1]
    keys = _keys(inputs, positions, mutation)  # (r, TILE, D)
    q = decode(inputs.q.view(torch.uint8)[rows], inputs.fp8, torch.float32)  # (r, H, D)
    weights = inputs.weights[rows]
    if mutation == RaggedMutation.HEAD_GROUP_WEIGHTS:
        weights = weights[:, torch.arange(heads, device=weights.device) % HEAD_GROUP]
    scores = torch.bmm(q, keys.transpose(1, 2)).relu_() * weights[:, :, None]  # (r, H, TILE)
    if rotation:
        scores = scores.roll(rotation % heads, dims=1)  # the same terms, summed from another head
    readable = (positions >= 0) & (positions < inputs.keys)
    scales = torch.where(readable, inputs.k_scale[positions.clamp(0, inputs.keys - 1)], math.nan)
    return scores.sum(dim=1) * scales


def _keys(inputs: RaggedInputs, positions: torch.Tensor, mutation: RaggedMutation) -> torch.Tensor:
    """float32 [r, TILE, D]: the keys at `positions`, NaN where the address leaves the buffer."""
    dim = inputs.k.shape[1]
    if mutation == RaggedMutation.KEY_OFFSET_INT32:
        positions = _wrapped(positions * dim) // dim  # the byte offset wrapped, then the key it addresses
    readable = (positions >= 0) & (positions < inputs.keys)
    raw = inputs.k.view(torch.uint8)[positions.clamp(0, inputs.keys - 1)]
    flavour = Fp8Flavour.E4M3FNUZ if mutation == RaggedMutation.FP8_FNUZ else inputs.fp8
    return decode(raw, flavour, torch.float32).masked_fill_(~readable[:, :, None], math.nan)


def _wrapped(offsets: torch.Tensor) -> torch.Tensor:
    """int64 offsets as an int32 computation leaves them: wrapped into [-2^31, 2^31)."""
    return (offsets + TWO_31) % TWO_32 - TWO_31


def _store(logits: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, values: torch.Tensor,
           stored: torch.Tensor, keys: int, mutation: RaggedMutation) -> tuple[torch.Tensor, torch.Tensor]:
    """Store `values` into each row's columns `positions` where `stored`; return the stores that leave the row
    (flat addresses and values), to be made after every row's own."""
    row_base = rows[:, None] * keys
    if mutation == RaggedMutation.ROW_OFFSET_INT32:
        row_base = _wrapped(row_base)
    flat = (row_base + positions)[stored]
    values = values[stored]
    own = (positions >= 0) & (positions < keys) & (row_base == rows[:, None] * keys)
    logits[flat[own[stored]]] = values[own[stored]]
    return flat[~own[stored]], values[~own[stored]]


def _store_strays(logits: torch.Tensor, strays: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """The stores that left their row, in order (the last to an address wins); those outside the output are
    dropped, as a guard past a Triton kernel's buffer takes them."""
    if not strays:
        return
    flat, values = torch.cat([f for f, _ in strays]), torch.cat([v for _, v in strays])
    inside = (flat >= 0) & (flat < logits.numel())
    flat, values = flat[inside], values[inside]
    order = torch.argsort(flat, stable=True)
    flat, values = flat[order], values[order]
    last = torch.ones_like(flat, dtype=torch.bool)
    last[:-1] = flat[1:] != flat[:-1]
    logits[flat[last]] = values[last]
