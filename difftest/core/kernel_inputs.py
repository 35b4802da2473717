"""Encoders: the canonical Case in the form one backend reads (lengths, cache bytes, fp8 flavour).

Every function here is exact and invertible where the form allows it; tests round-trip each one.
"""

from __future__ import annotations

import dataclasses

import torch

from difftest.core.case import Case, row_limits
from difftest.core.contract import Contract
from difftest.core.errors import SpecError, require
from difftest.core.fp8 import convert
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding
from difftest.core.layout import pack_cache


@dataclasses.dataclass(frozen=True)
class KernelInputs:
    """Exactly the tensors a kernel is handed, in the encoding and layout it was handed them."""

    q: torch.Tensor  # fp8 [B, next_n, H, D]; [T, 1, H, D] for the flattened encodings
    kv_cache: torch.Tensor  # uint8 [num_blocks, block_size, 1, D + 4]
    weights: torch.Tensor  # float32 [rows, H]
    context_lens: torch.Tensor  # int32, shaped as `encoding` says
    block_table: torch.Tensor  # int32 [B or T, W]; flat token ids (sum L,) under PREFIX_SUM
    max_model_len: int
    encoding: LengthEncoding
    layout: CacheLayout
    fp8: Fp8Flavour
    block_size: int
    indices: torch.Tensor | None = None  # int32 (T,): request id of each row (FLATTENED_INDICES)

    @property
    def rows(self) -> int:
        return self.weights.shape[0]


# --------------------------------------------------------------------------- paging

def token_table(case: Case) -> torch.Tensor:
    """int32 [B, W * block_size]: the pool slot of every logical token (AITER's block_size-1 table)."""
    slots = torch.arange(case.block_size, device=case.device, dtype=torch.int64)
    table = case.block_table.to(torch.int64)[:, :, None] * case.block_size + slots
    return table.reshape(case.batch, -1).to(torch.int32)


def repage_to_tokens(case: Case) -> Case:
    """The same case with block_size 1: one pool slot per block, the token table as block table."""
    num_slots = case.k_pool.shape[0] * case.block_size
    return dataclasses.replace(
        case, k_pool=case.k_pool.reshape(num_slots, 1, case.head_dim),
        scale_pool=case.scale_pool.reshape(num_slots, 1), block_table=token_table(case))


def ragged_token_ids(case: Case) -> torch.Tensor:
    """int32 (sum L,): the pool slots of each sequence's visible tokens, concatenated."""
    table = token_table(case)
    visible = torch.arange(table.shape[1], device=case.device)[None, :] < case.seq_lens[:, None]
    return table[visible]


# --------------------------------------------------------------------------- lengths

def encode_lengths(case: Case, encoding: LengthEncoding) -> dict[str, torch.Tensor | None]:
    """q, weights, context_lens, block_table and indices of `case` under `encoding`."""
    q, bt, rows = case.q, case.block_table, case.row_lens()
    flat_q = q.reshape(case.rows, 1, case.heads, case.head_dim)
    request_ids = torch.arange(case.batch, device=case.device).repeat_interleave(case.next_n)
    i32 = torch.int32
    if encoding == LengthEncoding.PER_ROW:
        return dict(q=q, context_lens=rows.to(i32), block_table=bt, indices=None)
    if encoding == LengthEncoding.PER_SEQUENCE:
        return dict(q=q, context_lens=case.seq_lens.to(i32), block_table=bt, indices=None)
    if encoding == LengthEncoding.FLATTENED:
        return dict(q=flat_q, context_lens=rows.reshape(-1).to(i32),
                    block_table=bt.repeat_interleave(case.next_n, dim=0), indices=None)
    if encoding == LengthEncoding.FLATTENED_INDICES:
        return dict(q=flat_q, context_lens=rows.reshape(-1).to(i32), block_table=bt,
                    indices=request_ids.to(i32))
    require(case.block_size == 1, "block_size", case.block_size,
            "1 for the prefix-sum encoding (flat token ids)")
    prefix = torch.zeros(case.batch + 1, dtype=torch.int64, device=case.device)
    prefix[1:] = torch.cumsum(case.seq_lens, 0)
    return dict(q=q, context_lens=prefix.to(i32), block_table=ragged_token_ids(case), indices=None)


def decode_row_lens(inputs: KernelInputs, batch: int, next_n: int) -> torch.Tensor:
    """(B, next_n) limits a reader that honours `inputs.encoding` sees: encode_lengths' inverse."""
    lens = inputs.context_lens.to(torch.int64)
    enc = inputs.encoding
    if enc == LengthEncoding.PER_SEQUENCE:
        return row_limits(lens, next_n)
    if enc == LengthEncoding.PREFIX_SUM:
        return row_limits(lens[1:] - lens[:-1], next_n)
    return lens.reshape(batch, next_n)


# --------------------------------------------------------------------------- the whole case

def adapt_block_size(case: Case, contract: Contract) -> Case:
    """The case re-paged to a block size the contract accepts; SpecError when none fits."""
    fed = contract.block_size_for(case.block_size)
    if fed is None:
        raise SpecError("block_size", case.block_size, f"one of {list(contract.block_sizes or ())}")
    return case if fed == case.block_size else repage_to_tokens(case)


def encode(case: Case, contract: Contract, *, encoding: LengthEncoding | None = None,
           layout: CacheLayout | None = None) -> KernelInputs:
    """The inputs a backend with `contract` reads; `encoding`/`layout` override it (what-if runs)."""
    case = adapt_block_size(case, contract)
    encoding = encoding or contract.length_encoding
    layout = layout or contract.cache_layout
    parts = encode_lengths(case, encoding)
    q_bytes = convert(parts["q"], case.fp8, contract.fp8, "q")
    k_bytes = convert(case.k_pool, case.fp8, contract.fp8, "k_pool")
    return KernelInputs(
        q=q_bytes.view(contract.fp8.dtype), kv_cache=pack_cache(k_bytes, case.scale_pool, layout),
        weights=case.weights, context_lens=parts["context_lens"],
        block_table=parts["block_table"].to(torch.int32).contiguous(),
        max_model_len=case.max_model_len, encoding=encoding, layout=layout, fp8=contract.fp8,
        block_size=case.block_size, indices=parts["indices"])
