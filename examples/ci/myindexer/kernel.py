"""The kernel: paged MQA logits in plain torch, with DeepGEMM's calling convention (per-sequence lengths).

logits[b * next_n + j, p] = sum_h weights[b * next_n + j, h] * relu(q[b, j, h] . k[b, p]) * scale[b, p]
for every key position p below row j's causal limit L_b - next_n + j + 1, and -inf past it.
"""

from __future__ import annotations

import math

import torch


def paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                     block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """q: fp8 e4m3fn [B, next_n, H, D]; kv_cache: uint8 [blocks, block_size, 1, D + 4], per block all
    keys then all float32 scales; weights: float32 [B * next_n, H]; context_lens: int32 [B], each
    sequence's length with its next_n query tokens; block_table: int32 [B, W]. Returns float32
    [B * next_n, max_model_len]."""
    batch, next_n, heads, dim = q.shape
    keys, scales = _unpack(kv_cache, dim)
    positions = torch.arange(max_model_len, device=q.device)
    columns = (positions // keys.shape[1]).clamp(max=block_table.shape[1] - 1)  # a row's tail reads no further
    blocks = block_table[:, columns].long()  # [B, max_model_len]: the block of token p
    slots = positions % keys.shape[1]
    k, s = keys[blocks, slots], scales[blocks, slots]  # [B, max_model_len, D], [B, max_model_len]
    scores = torch.einsum("bjhd,bpd->bjhp", q.float(), k).relu()
    logits = torch.einsum("bjhp,bjh->bjp", scores, weights.reshape(batch, next_n, heads)) * s[:, None, :]
    limits = context_lens.long()[:, None] - next_n + 1 + torch.arange(next_n, device=q.device)  # [B, next_n]
    visible = positions < limits[:, :, None]
    return torch.where(visible, logits, -math.inf).reshape(batch * next_n, max_model_len)  # a select: NaN * 0 is NaN


def _unpack(kv_cache: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys as float32 [blocks, block_size, D] and scales [blocks, block_size] of a block-split cache."""
    blocks, block_size = kv_cache.shape[:2]
    per_block = kv_cache.reshape(blocks, block_size * (dim + 4))
    keys = per_block[:, : block_size * dim].reshape(blocks, block_size, dim).view(torch.float8_e4m3fn).float()
    return keys, per_block[:, block_size * dim :].contiguous().view(torch.float32)
