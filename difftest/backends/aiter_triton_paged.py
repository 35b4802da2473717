"""The paged generation of AITER's two non-ragged Triton kernels (ROCm/aiter main, after 0.1.7.x),
launched as their production caller, vLLM 0.34's rocm_fp8_paged_mqa_logits, has AITER's wrappers
launch them (aiter/ops/triton/attention/pa_mqa_logits.py; the non-gluon branch, the one taken off
gfx942/gfx950/gfx1250, so on NVIDIA and under the interpreter).

What changed from 0.1.7.x (aiter_triton's launch):
* The cache is paged with any block size: [num_blocks, block_size, 1, D + 4] bytes, block-split
  (each block's block_size * D fp8 keys, then its block_size fp32 scales). The kernel takes a block
  and a token stride for keys and scales, and KVBlockSize as a constexpr.
* ChunkK = 256 (vLLM passes it to the fused wrapper; the stage1 wrapper's default), and the number
  of programs per row is no longer 5 but SplitKV = (max(1, CUs // TileQCount) + 4) // 5 * 5 * WavePerEU,
  with TileQCount the query tiles (B * next_n * H / ChunkQ) and WavePerEU = 2.
* vLLM passes ChunkQ = H to stage1 (0.1.7's wrapper fixed 32), and pre-fills stage1's per-head
  buffer with -inf; the fused kernel writes into vLLM's workspace, which nobody fills: positions
  past the chunks covering a row's length keep whatever was there (TAIL_UNSPECIFIED).
Unchanged: one length per sequence (context_len_ptr + pid_batch), each draft row's window derived in
the kernel as p <= L - next_n + row.
"""

from __future__ import annotations

import ast
import contextlib
import functools
from pathlib import Path
from typing import Any

import torch

from difftest.core import hardware
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, MaskConvention
from difftest.core.triton_interpret import interpreter_compat

_COMMON = ("batch_size", "next_n", "heads_num", "Q_buffer", "stride_q_batch", "stride_q_next_n", "stride_q_heads",
           "KV_buffer", "stride_k_block", "stride_k_token", "scale_buffer", "stride_scale_block",
           "stride_scale_token", "context_len_ptr", "kv_indices", "weights", "stride_w_batch")
_TAIL = ("stride_out_batch", "max_model_len", "max_blk_len", "ChunkQ", "ChunkK", "HiddenDim", "KVBlockSize", "SplitKV")
ARG_NAMES = {
    "_deepgemm_fp8_paged_mqa_logits_stage1": (*_COMMON, "Out_buffer", "stride_out_heads", *_TAIL),
    "_deepgemm_fp8_paged_mqa_logits": (*_COMMON, "OutLogits_buffer", *_TAIL),
}
CHUNK_K = 256  # vLLM 0.34: ChunkK=256 to the fused wrapper; the stage1 wrapper's default
WAVES_PER_EU = 2  # vLLM 0.34: WavePerEU=2 to the fused wrapper; the stage1 wrapper's default
# A CPU has no compute units for the wrappers' get_num_sms(); under the interpreter SplitKV is
# computed from this stand-in, which changes how a row's chunks are cut, not what is computed.
CPU_COMPUTE_UNITS = 8
# Block sizes: any, as far as the kernels go (a token's block and offset are computed per position);
# the fused wrapper asserts ChunkK % KVBlockSize == 0 or the reverse. These divide ChunkK.
BLOCK_SIZES = (1, 16, 32, 64, 128, 256)


@functools.cache
def kernel_args(path: Path, kernel: str) -> tuple[str, ...] | None:
    """The parameter names of `kernel` in the file at `path`, read without importing it; None if absent."""
    tree = ast.parse(path.read_text(), str(path))
    found = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == kernel), None)
    return None if found is None else tuple(a.arg for a in found.args.args)


def is_paged(path: Path, kernel: str) -> bool:
    """Whether `kernel` in `path` takes the paged generation's arguments."""
    return kernel in ARG_NAMES and kernel_args(path, kernel) == ARG_NAMES[kernel]


def contract_changes(per_head: bool) -> dict[str, Any]:
    """The Contract fields in which the paged generation differs from 0.1.7.x's (aiter_triton).

    Stage1's working memory is not among them: main's wrapper still takes the [H, rows, max_model_len]
    fp32 buffer from its caller (attention/pa_mqa_logits.py:185-189), and vLLM 0.34 still takes it
    from its workspace and sums it over heads (rocm_aiter_mla_sparse.py:905-919), as 0.33 did."""
    return {"cache_layout": CacheLayout.BLOCK_SPLIT, "block_sizes": BLOCK_SIZES, "tiles": (CHUNK_K,),
            # vLLM pre-fills stage1's buffer; the fused kernel's workspace is nobody's to clean.
            "mask": MaskConvention.TAIL_NEG_INF if per_head else MaskConvention.TAIL_UNSPECIFIED,
            # ChunkQ = H: one tl.arange over all heads, and an fp8 tl.dot on NVIDIA needs M = H >= 16.
            "heads_power_of_two": True, "heads_multiple_of": 16,
            # The split count follows the device's compute units and the batch: no fixed partition.
            "partition": None}


def split_kv(query_tiles: int, device: torch.device) -> int:
    """The wrappers' SplitKV for `query_tiles` tiles on `device` (gfx1250 doubles it; not reached here)."""
    units = CPU_COMPUTE_UNITS if device.type == "cpu" else hardware.sm_count(device.index)
    return (max(1, units // query_tiles) + 4) // 5 * 5 * WAVES_PER_EU


def launch(fn: Any, per_head: bool, inputs: KernelInputs, out: torch.Tensor) -> None:
    """One launch as the wrapper makes it; `out` is [H, rows, L] (stage1) or [rows, L]."""
    q, weights = inputs.q, inputs.weights
    batch, next_n, heads, head_dim = q.shape
    num_blocks, block_size = inputs.kv_cache.shape[:2]
    packed = inputs.kv_cache.view(num_blocks, -1)
    keys = packed[:, :block_size * head_dim].view(num_blocks, block_size, head_dim).view(torch.float8_e4m3fn)
    scales = packed[:, block_size * head_dim:].view(torch.float32)  # [num_blocks, block_size]
    splits = split_kv(batch * next_n, q.device)  # ChunkQ = H: one query tile per row
    out_strides = (out.stride(0), out.stride(1)) if per_head else (out.stride(0),)
    interpret = q.device.type == "cpu"
    with interpreter_compat() if interpret else contextlib.nullcontext():
        fn[(batch * next_n * splits,)](
            batch, next_n, heads, q, q.stride(0), q.stride(1), q.stride(2),
            keys, keys.stride(0), keys.stride(1), scales, scales.stride(0), scales.stride(1),
            inputs.context_lens, inputs.block_table, weights, weights.stride(0), out, *out_strides,
            inputs.max_model_len, inputs.block_table.shape[1],
            waves_per_eu=WAVES_PER_EU, ChunkQ=heads, ChunkK=CHUNK_K, HiddenDim=head_dim,
            KVBlockSize=block_size, SplitKV=splits)
