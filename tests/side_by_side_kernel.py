"""The Triton kernel of tests/side_by_side_backends.py: @triton.jit only, so that
difftest.core.triton_interpret.load_kernel_module executes this file once per mode (interpreted on the
CPU, compiled on a GPU).

Paged MQA logits under DeepGEMM's contract (per-row lengths, block-split e4m3fn cache, fp32 output, -inf
past each window): one program scores one block of one query row, (H, D) x (D, block) in fp32 ("ieee":
e4m3 values and their products are exact in fp32), then the head-weighted ReLU sum and the token scales.
Offsets are int64: a block's byte base and a row's output offset pass 2^31 at production sizes.
PLANT = 1 plants an off-by-one at the window end: each row loses its last visible key (FAIL(mask)).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_mqa_logits(q_ptr, kv_ptr, w_ptr, lens_ptr, table_ptr, out_ptr, table_stride, max_model_len,
                     NEXT_N: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                     PLANT: tl.constexpr):
    row = tl.program_id(0)  # b * NEXT_N + j
    column = tl.program_id(1)  # a block-table column of sequence b
    seq = row // NEXT_N
    limit = tl.load(lens_ptr + row) - PLANT  # per-row causal limit
    heads, dims, slots = tl.arange(0, H), tl.arange(0, D), tl.arange(0, BLOCK)
    positions = column * BLOCK + slots
    visible = positions < limit
    block_id = tl.load(table_ptr + seq.to(tl.int64) * table_stride + column)
    base = block_id.to(tl.int64) * (BLOCK * (D + 4))  # block-split: BLOCK * D key bytes, then BLOCK scales
    key_bytes = tl.load(kv_ptr + base + slots[:, None] * D + dims[None, :], mask=visible[:, None], other=0)
    keys = key_bytes.to(tl.float8e4nv, bitcast=True).to(tl.float32)  # (BLOCK, D)
    scale_ptr = (kv_ptr + base + BLOCK * D).to(tl.pointer_type(tl.float32))
    scales = tl.load(scale_ptr + slots, mask=visible, other=0.0)
    q = tl.load(q_ptr + row.to(tl.int64) * H * D + heads[:, None] * D + dims[None, :]).to(tl.float32)  # (H, D)
    weights = tl.load(w_ptr + row.to(tl.int64) * H + heads)
    scores = tl.maximum(tl.dot(q, tl.trans(keys), input_precision="ieee"), 0.0)  # (H, BLOCK)
    logits = tl.sum(scores * weights[:, None], axis=0) * scales
    logits = tl.where(visible, logits, float("-inf"))
    tl.store(out_ptr + row.to(tl.int64) * max_model_len + positions, logits, mask=positions < max_model_len)
