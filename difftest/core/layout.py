"""Cache bytes: a key pool and its scales as the uint8 [num_blocks, block_size, 1, D + 4] cache a
kernel reads, in either byte layout (docs/reference/layouts.md), and back."""

from __future__ import annotations

import torch

from difftest.core.errors import require
from difftest.core.kinds import CacheLayout


def pack_cache(k_pool: torch.Tensor, scale_pool: torch.Tensor, layout: CacheLayout) -> torch.Tensor:
    """uint8 [num_blocks, block_size, 1, D + 4] cache bytes of a key pool and its scales."""
    num_blocks, block_size, head_dim = k_pool.shape
    scale_bytes = scale_pool.contiguous().view(torch.uint8).reshape(num_blocks, block_size, 4)
    if layout == CacheLayout.TOKEN_INTERLEAVED:
        per_token = torch.cat([k_pool, scale_bytes], dim=-1)  # (NB, bs, D + 4)
        return per_token.reshape(num_blocks, block_size, 1, head_dim + 4).contiguous()
    keys = k_pool.reshape(num_blocks, block_size * head_dim)
    flat = torch.cat([keys, scale_bytes.reshape(num_blocks, block_size * 4)], dim=-1)
    return flat.reshape(num_blocks, block_size, 1, head_dim + 4).contiguous()


def unpack_cache(kv_cache: torch.Tensor, head_dim: int, layout: CacheLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_pool uint8 [NB, bs, D], scale_pool float32 [NB, bs]) from cache bytes: pack_cache's inverse."""
    require(kv_cache.dim() == 4 and kv_cache.shape[2] == 1 and kv_cache.shape[3] == head_dim + 4,
            "kv_cache.shape", tuple(kv_cache.shape), f"[num_blocks, block_size, 1, D + 4 = {head_dim + 4}]")
    num_blocks, block_size = kv_cache.shape[:2]
    if layout == CacheLayout.TOKEN_INTERLEAVED:
        per_token = kv_cache.reshape(num_blocks, block_size, head_dim + 4)
        keys, scale_bytes = per_token[..., :head_dim], per_token[..., head_dim:]
    else:
        flat = kv_cache.reshape(num_blocks, block_size * (head_dim + 4))
        keys = flat[:, : block_size * head_dim].reshape(num_blocks, block_size, head_dim)
        scale_bytes = flat[:, block_size * head_dim:].reshape(num_blocks, block_size, 4)
    scales = scale_bytes.contiguous().view(torch.float32).reshape(num_blocks, block_size)
    return keys.contiguous(), scales
