"""Triton kernels written to break on the GPU, for scripts/device_visit.sh isolation and the isolation tests.

One paged MQA logits kernel (DeepGEMM's contract: per-row lengths, block-split e4m3fn cache, fp32
output, -inf past each window), compiled in three variants by the BUG constexpr:

    triton-good            BUG = 0: right; the control that must PASS beside the broken ones
    triton-oob-read        BUG = 1: the grid has one column more than the block table, and the
                           block-id load that should be masked off there is not: the last sequence
                           reads 4 bytes past the end of the table. Nothing read there is used, so
                           the logits are right and difftest says PASS; compute-sanitizer memcheck
                           (--sanitize memcheck --sanitize-all) reports the invalid read.
    triton-illegal-write   BUG = 2: every store lands 4 TiB past the output: an illegal memory
                           access, a sticky CUDA error. Under --isolate its worker reports CRASH and
                           is replaced; without isolation every later CUDA call of the run fails.
    triton-last-tile-spill BUG = 3: a program per (row, output tile), the grid over ceil(max_model_len
                           / block) tiles, and the store's bound `positions < max_model_len` left out:
                           where max_model_len is not a multiple of the block, the last tile's
                           positions past the row land on the next row's first ones (the buffer has
                           a tile of slack at its end, so the last row's stay inside the allocation).
                           Right at every aligned max_model_len; the unaligned-max-model-len family
                           catches it (FAIL(mask)).
    triton-int32-block-base BUG = 4: the block's byte offset block_id * block * (D + 4) kept in int32.
                           Right while every used block starts below 2^31 bytes (pool-over-2^31-bytes
                           only crosses it inside its top block, where the pointer is already 64-bit);
                           the block-base-past-2^31-bytes case makes the offset negative (an illegal
                           address: CRASH), block-base-past-2^32-bytes wraps it to a NaN canary block
                           (FAIL(nan)).

Load one with `--backend-module tests.gpu_broken_backends:TritonOobRead`. One program scores one
block of one query row: (H, D) x (D, block) in fp32 (e4m3 values and their products are exact in
fp32), then the head-weighted ReLU sum and the token scales. It also runs on the CPU under
TRITON_INTERPRET=1, which is how the test suite checks the good variant against the oracle (and the
last-tile spill on its unaligned cases). The contract is the production envelope's (H 64, D 128,
block 64 on a GPU): scripts/device_visit.sh planted-edges runs the last two there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from difftest.core.contract import Contract
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention

# Elements past the output that BUG = 2 stores to: far outside any allocation. A constexpr, since
# a jit function may read no other kind of global.
HUGE_OFFSET = tl.constexpr(1 << 40)


@triton.jit
def paged_mqa_logits_kernel(q_ptr, kv_ptr, w_ptr, lens_ptr, table_ptr, out_ptr, table_stride, max_model_len,
                            NEXT_N: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                            WIDTH: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0)  # b * NEXT_N + j
    if BUG == 3:
        # Rows last to first. The interpreter runs programs one after another in grid order, where the
        # next row's own first tile would overwrite the spill; on a GPU every row's first tile is stored
        # before any row's last one (blockIdx.x, the row, varies fastest), in either order.
        row = tl.num_programs(0) - 1 - row
    column = tl.program_id(1)  # a block-table column of sequence b
    seq = row // NEXT_N
    limit = tl.load(lens_ptr + row)  # per-row causal limit
    heads, dims, slots = tl.arange(0, H), tl.arange(0, D), tl.arange(0, BLOCK)
    positions = column * BLOCK + slots
    visible = positions < limit
    if BUG == 1:
        block_id = tl.load(table_ptr + seq * table_stride + column)  # column == WIDTH reads past the table
    else:
        block_id = tl.load(table_ptr + seq * table_stride + column, mask=column < WIDTH, other=0)
    if BUG == 4:
        base = block_id * (BLOCK * (D + 4))  # int32: wraps past 2^31 bytes
    else:
        base = block_id.to(tl.int64) * (BLOCK * (D + 4))  # block-split: BLOCK * D key bytes, then BLOCK scales
    key_bytes = tl.load(kv_ptr + base + slots[:, None] * D + dims[None, :], mask=visible[:, None], other=0)
    keys = key_bytes.to(tl.float8e4nv, bitcast=True).to(tl.float32)  # (BLOCK, D)
    scale_ptr = (kv_ptr + base + BLOCK * D).to(tl.pointer_type(tl.float32))
    scales = tl.load(scale_ptr + slots, mask=visible, other=0.0)
    q_row = q_ptr + row.to(tl.int64) * (H * D)  # 64-bit: q passes 2^31 bytes at 2^31 / (H * D) rows
    q = tl.load(q_row + heads[:, None] * D + dims[None, :]).to(tl.float32)  # (H, D)
    weights = tl.load(w_ptr + row * H + heads)
    # ieee: fp32 products of fp8 values are exact, where the default tf32 would round the inputs.
    scores = tl.maximum(tl.dot(q, tl.trans(keys), input_precision="ieee"), 0.0)  # (H, BLOCK)
    logits = tl.sum(scores * weights[:, None], axis=0) * scales
    logits = tl.where(visible, logits, float("-inf"))
    offsets = row.to(tl.int64) * max_model_len + positions
    if BUG == 2:
        offsets += HUGE_OFFSET
    if BUG == 3:
        tl.store(out_ptr + offsets, logits)  # the whole tile, past max_model_len too
    else:
        tl.store(out_ptr + offsets, logits, mask=positions < max_model_len)


class _TritonLogits:
    """A variant of the kernel as a backend; the subclasses pick the BUG."""

    name = "triton-good"
    bug = 0
    contract = Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                        mask=MaskConvention.TAIL_NEG_INF, rtol=1e-6, devices=("cuda",), block_sizes=(16, 32, 64),
                        head_dims=(32, 64, 128), heads_multiple_of=16, heads_power_of_two=True,
                        library=f"triton {triton.__version__} (tests.gpu_broken_backends)")

    def unavailable_reason(self, device: str) -> str | None:
        if device != "cuda" or not torch.cuda.is_available():
            return "a Triton GPU kernel: needs --device cuda and a GPU torch can see"
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        _, next_n, heads, dim = inputs.q.shape
        width = inputs.block_table.shape[1]
        logits = self._output(inputs)
        paged_mqa_logits_kernel[self._grid(inputs)](inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens,
                                                    inputs.block_table, logits, inputs.block_table.stride(0),
                                                    inputs.max_model_len, NEXT_N=next_n, H=heads, D=dim,
                                                    BLOCK=inputs.block_size, WIDTH=width, BUG=self.bug)
        return logits

    def _grid(self, inputs: KernelInputs) -> tuple[int, int]:
        """(rows, block-table columns): one more column for the stray read of BUG 1."""
        return inputs.rows, inputs.block_table.shape[1] + (1 if self.bug == 1 else 0)

    def _output(self, inputs: KernelInputs) -> torch.Tensor:
        return torch.empty(inputs.rows, inputs.max_model_len, dtype=torch.float32, device=inputs.q.device)


class TritonGood(_TritonLogits):
    """BUG = 0: the control."""


class TritonOobRead(_TritonLogits):
    """BUG = 1: an unmasked block-id load one column past the end of the block table."""

    name = "triton-oob-read"
    bug = 1


class TritonIllegalWrite(_TritonLogits):
    """BUG = 2: stores 4 TiB past the output (illegal memory access)."""

    name = "triton-illegal-write"
    bug = 2


class TritonLastTileSpill(_TritonLogits):
    """BUG = 3: whole output tiles stored, past max_model_len too, over a grid of ceil(max_model_len /
    block) tiles per row."""

    name = "triton-last-tile-spill"
    bug = 3

    def _grid(self, inputs: KernelInputs) -> tuple[int, int]:
        return inputs.rows, triton.cdiv(inputs.max_model_len, inputs.block_size)

    def _output(self, inputs: KernelInputs) -> torch.Tensor:
        """[rows, max_model_len], a view of a buffer one tile longer, so the last row's spill stays inside it."""
        flat = torch.empty(inputs.rows * inputs.max_model_len + inputs.block_size, dtype=torch.float32,
                           device=inputs.q.device)
        return flat[: inputs.rows * inputs.max_model_len].view(inputs.rows, inputs.max_model_len)


class TritonInt32BlockBase(_TritonLogits):
    """BUG = 4: the block's byte offset kept in int32."""

    name = "triton-int32-block-base"
    bug = 4
