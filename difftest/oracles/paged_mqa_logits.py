"""Reference paged MQA logits (docs/reference/kernel.md), written to be read.

    logits[b*next_n + j, p] = sum_h w[b*next_n + j, h] * relu(q[b, j, h, :] . k_b[p, :]) * s_b[p]
                              for p < len[b, j], and -inf for every other p < max_model_len

k_b[p] and s_b[p] are the key bytes and scale of slot p % block_size of physical block
block_table[b, p // block_size]. In float64 on the CPU every fp8 product and every sum is exact to
float64 rounding, so this is the truth to ~1e-15. On a GPU the same code runs in float32 when asked
(dtype=torch.float32): products of fp8 values are exact in float32, sums round (fp32_error_bound).
Sequences are processed a few at a time so a 120K context fits in memory; there is no per-block loop.
"""

from __future__ import annotations

import math

import torch

from difftest.core.case import Case

# Elements of the (sequences, next_n, H, positions) score tensor computed at once: on the CPU a few
# MB; on a GPU 8x more (128 MB of fp32 scores), where each chunk costs ~10 launches whatever its size
# and a small-case batch of 900 sequences would otherwise take ~200 chunks.
_CHUNK_ELEMENTS = 1 << 22
_GPU_CHUNK_ELEMENTS = 1 << 25


def paged_mqa_logits(q: torch.Tensor, k_pool: torch.Tensor, scale_pool: torch.Tensor,
                     weights: torch.Tensor, block_table: torch.Tensor, row_lens: torch.Tensor,
                     max_model_len: int, positions: int | None = None) -> torch.Tensor:
    """Logits [B * next_n, max_model_len] of decoded inputs, in q's dtype; -inf past each limit.

    The positions computed are the longest row's (read on the host), or `positions` where the caller gives
    them (no host read: what a CUDA graph can capture; at most what the block table holds).

    q (B, next_n, H, D) holds values; k_pool (num_blocks, block_size, D) values or fp8 keys (decoded
    after the gather, so only visible blocks are widened); scale_pool (num_blocks, block_size),
    weights (B * next_n, H), block_table (B, W), and row_lens (B, next_n) the limit of every row.
    """
    batch, next_n, heads, _ = q.shape
    out = torch.full((batch * next_n, max_model_len), -math.inf, dtype=q.dtype, device=q.device)
    longest = positions if positions is not None else int(row_lens.max()) if row_lens.numel() else 0
    visible = min(longest, max_model_len)
    w = weights.to(q.dtype).reshape(batch, next_n, heads)
    for first, last in _sequence_chunks(batch, next_n * heads * max(visible, 1), q.device):
        keys, scales = _gather(k_pool, scale_pool, block_table[first:last], visible)  # (b, P, D), (b, P)
        scores = torch.einsum("bjhd,bpd->bjhp", q[first:last], keys.to(q.dtype)).relu_()
        logits = torch.einsum("bjh,bjhp->bjp", w[first:last], scores).mul_(scales.to(q.dtype)[:, None, :])
        outside = torch.arange(visible, device=q.device) >= row_lens[first:last, :, None]  # (b, j, P)
        out[first * next_n:last * next_n, :visible] = logits.masked_fill_(outside, -math.inf).flatten(0, 1)
    return out


def fp32_error_bound(q: torch.Tensor, k_pool: torch.Tensor, scale_pool: torch.Tensor,
                     weights: torch.Tensor, block_table: torch.Tensor, row_lens: torch.Tensor) -> torch.Tensor:
    """(B * next_n,) largest rounding error, inside each row's window, of a float32 evaluation.

    A float32 dot of D exact fp8 products errs by at most gamma_D * sum_d |q_d k_d| (Higham 3.1);
    scaling, weighting and the H-term sum add gamma_H + 3u. With sum_h |w_h| |q_h| folded first this
    costs one (next_n, D) x (D, P) product per sequence.
    """
    batch, next_n, heads, dim = q.shape
    unit = 2.0 ** -24
    gamma = (dim + heads + 3) * unit / (1 - (dim + heads + 3) * unit)
    visible = int(row_lens.max()) if row_lens.numel() else 0
    w = weights.to(q.dtype).abs().reshape(batch, next_n, heads, 1)
    folded = (w * q.abs()).sum(dim=2)  # (B, next_n, D)
    bound = torch.zeros(batch * next_n, dtype=q.dtype, device=q.device)
    if visible == 0:
        return bound
    for first, last in _sequence_chunks(batch, next_n * max(visible, 1), q.device):
        keys, scales = _gather(k_pool, scale_pool, block_table[first:last], visible)
        mags = torch.einsum("bjd,bpd->bjp", folded[first:last], keys.to(q.dtype).abs()) * scales.to(q.dtype)[:, None, :]
        inside = torch.arange(visible, device=q.device) < row_lens[first:last, :, None]
        mags = torch.where(inside, mags, 0.0).nan_to_num(0.0)
        bound[first * next_n:last * next_n] = gamma * mags.amax(dim=-1).flatten()
    return bound


def reference(case: Case, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """paged_mqa_logits of a Case, on the case's device, in `dtype` (float64 unless on a GPU)."""
    return paged_mqa_logits(case.q_values(dtype), case.k_pool.view(case.fp8.dtype), case.scale_pool,
                            case.weights, case.block_table, case.row_lens(), case.max_model_len)


def _gather(k_pool: torch.Tensor, scale_pool: torch.Tensor, block_table: torch.Tensor,
            positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logical keys (b, positions, D) and scales (b, positions) of sequences through their table."""
    block_size = k_pool.shape[1]
    blocks = block_table[:, : -(-positions // block_size)].long()
    # Columns past a sequence's length may hold stale ids: clamp so the gather stays in the pool;
    # what they point at is masked to -inf by the caller.
    blocks = blocks.clamp(0, k_pool.shape[0] - 1)
    # fp8 keys are gathered as bytes and decoded by the caller: only the visible blocks get widened.
    raw = k_pool.view(torch.uint8) if k_pool.element_size() == 1 else k_pool
    keys = raw[blocks].flatten(1, 2)[:, :positions].view(k_pool.dtype)
    scales = scale_pool[blocks].flatten(1, 2)[:, :positions]
    return keys, scales


def _sequence_chunks(batch: int, elements_per_sequence: int, device: torch.device) -> list[tuple[int, int]]:
    chunk = _GPU_CHUNK_ELEMENTS if device.type == "cuda" else _CHUNK_ELEMENTS
    step = max(1, chunk // elements_per_sequence)
    return [(first, min(first + step, batch)) for first in range(0, batch, step)]
