"""Reference ragged (prefill) MQA logits (docs/reference/ragged.md), written to be read.

    logits[i, j] = sum_h w[i, h] * relu(q[i, h, :] . k[k_start[i] + j, :]) * k_scale[k_start[i] + j]
                   for j < k_end[i] - k_start[i], and -inf for every other j < width

The output is window-relative: column j of row i is key k_start[i] + j (the comparison maps an ABSOLUTE
kernel's [rows, keys] onto it). The key scale comes after the head sum, as in the paged oracle: DeepGEMM
applies it after the ReLU, which is the same thing since it does not depend on the head, and equals
relu(q . k * s) because every scale a window holds is positive (RaggedCase.validate). In float64 every fp8
product and every sum is exact to float64 rounding: this is the truth to ~1e-15. Rows are processed a few at
a time, each chunk over its own key range, so a 128K-key prefill fits in memory; there is no loop per key.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from difftest.core.ragged import RaggedCase

_CHUNK_ELEMENTS = 1 << 22  # (rows, heads, keys) score elements computed at once
_GPU_CHUNK_ELEMENTS = 1 << 25


def ragged_mqa_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                      k_start: torch.Tensor, k_end: torch.Tensor, width: int) -> torch.Tensor:
    """Window-relative logits [rows, width] in q's dtype; -inf from column k_end - k_start on.

    q (rows, H, D) holds values; k (keys, D) values or fp8-typed keys (decoded chunk by chunk, so only the keys
    a chunk of rows reads are widened); k_scale (keys,), weights (rows, H), k_start and k_end (rows,).
    """
    rows = q.shape[0]
    out = torch.full((rows, width), -math.inf, dtype=q.dtype, device=q.device)
    for first, last in _row_chunks(q, k_start, k_end):
        lo, hi, keys = _key_range(k, k_start[first:last], k_end[first:last], q.dtype)
        scores = torch.einsum("mhd,pd->mhp", q[first:last], keys).relu_()
        logits = torch.einsum("mh,mhp->mp", weights[first:last].to(q.dtype), scores) * k_scale[lo:hi].to(q.dtype)
        out[first:last] = _window_relative(logits, k_start[first:last] - lo, k_end[first:last] - lo, width)
    return out


def fp32_error_bound(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                     k_start: torch.Tensor, k_end: torch.Tensor) -> torch.Tensor:
    """(rows,) largest rounding error, inside each row's window, of a float32 evaluation.

    As difftest.oracles.paged_mqa_logits.fp32_error_bound: a float32 dot of D exact fp8 products errs by at
    most gamma_D * sum_d |q_d k_d| (Higham 3.1); weights, the H-term head sum and the scale add gamma_H + 3u:
    bound[i] = gamma_{D+H+3} * max over the window of k_scale[p] * sum_d (sum_h |w_ih| |q_ihd|) |k_pd|.
    0 for an empty window.
    """
    rows, heads, dim = q.shape
    unit = 2.0 ** -24
    n = dim + heads + 3
    gamma = n * unit / (1 - n * unit)
    folded = (weights.to(q.dtype).abs()[:, :, None] * q.abs()).sum(dim=1)  # (rows, D)
    bound = torch.zeros(rows, dtype=q.dtype, device=q.device)
    for first, last in _row_chunks(q, k_start, k_end, heads_per_row=1):
        lo, hi, keys = _key_range(k, k_start[first:last], k_end[first:last], q.dtype)
        mags = (folded[first:last] @ keys.abs().T) * k_scale[lo:hi].to(q.dtype)  # (m, P)
        positions = torch.arange(hi - lo, device=q.device)
        inside = (positions >= (k_start[first:last] - lo)[:, None]) & (positions < (k_end[first:last] - lo)[:, None])
        if hi > lo:  # the chunk's rows hold a key: their largest magnitude (0 for an empty window)
            bound[first:last] = gamma * torch.where(inside, mags, 0.0).nan_to_num(0.0).amax(dim=1)
    return bound


def reference(case: RaggedCase, width: int | None = None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """ragged_mqa_logits of a RaggedCase on the case's device, `width` columns (default: the case's
    max_seqlen_k, or its longest window), in `dtype` (float64 unless on a GPU)."""
    return ragged_mqa_logits(case.q_values(dtype), case.k.view(case.fp8.dtype), case.k_scale, case.weights,
                             case.k_start, case.k_end, case.seqlen_k if width is None else width)


def error_bound(case: RaggedCase) -> torch.Tensor:
    """fp32_error_bound of a RaggedCase, in float64."""
    return fp32_error_bound(case.q_values(), case.k.view(case.fp8.dtype), case.k_scale, case.weights,
                            case.k_start, case.k_end)


def absolute(relative: torch.Tensor, k_start: torch.Tensor, keys: int) -> torch.Tensor:
    """[rows, keys] logits with column p holding key p, from window-relative ones (-inf where no column of
    `relative` holds the key): the ABSOLUTE form of the same answer."""
    rows, width = relative.shape
    out = torch.full((rows, keys), -math.inf, dtype=relative.dtype, device=relative.device)
    columns = k_start[:, None] + torch.arange(width, device=relative.device)
    fits = columns < keys
    out[torch.arange(rows, device=relative.device)[:, None].expand(rows, width)[fits], columns[fits]] = relative[fits]
    return out


def _window_relative(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, width: int) -> torch.Tensor:
    """(m, width): column j of row i is logits[i, starts[i] + j] for j < ends[i] - starts[i], else -inf."""
    columns = torch.arange(width, device=logits.device)
    keys = starts[:, None] + columns
    inside = keys < ends[:, None]
    picked = logits.gather(1, keys.clamp(0, max(logits.shape[1] - 1, 0))) if logits.shape[1] else \
        torch.zeros_like(keys, dtype=logits.dtype)
    return torch.where(inside, picked, -math.inf)


def _key_range(k: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
               dtype: torch.dtype) -> tuple[int, int, torch.Tensor]:
    """(lo, hi, keys): the keys [lo, hi) the rows' non-empty windows span, decoded to `dtype`."""
    nonempty = ends > starts
    if not bool(nonempty.any()):
        return 0, 0, torch.zeros((0, k.shape[1]), dtype=dtype, device=k.device)
    lo, hi = int(starts[nonempty].min()), int(ends[nonempty].max())
    return lo, hi, k[lo:hi].to(dtype)


def _row_chunks(q: torch.Tensor, k_start: torch.Tensor, k_end: torch.Tensor,
                heads_per_row: int | None = None) -> Iterator[tuple[int, int]]:
    """(first, last) row ranges whose (rows, heads, keys spanned) scores stay under the chunk size: the
    span is the whole case's, an upper bound for every chunk."""
    rows, heads = q.shape[:2]
    nonempty = k_end > k_start
    span = int(k_end[nonempty].max() - k_start[nonempty].min()) if bool(nonempty.any()) else 0
    budget = _GPU_CHUNK_ELEMENTS if q.device.type == "cuda" else _CHUNK_ELEMENTS
    step = max(1, budget // max(1, (heads_per_row or heads) * span))
    for first in range(0, rows, step):
        yield first, min(first + step, rows)
