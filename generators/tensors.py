"""How a CaseSpec becomes tensors: seeded torch RNG, on the CPU or a GPU, no Python loop per token."""

from __future__ import annotations

import torch

from difftest.case import Case
from difftest.fp8 import COMMON_MAX, convert
from difftest.generators.spec import CaseSpec, LengthDist, Stale, Values, case_name
from difftest.kinds import Fp8Flavour


def build_case(spec: CaseSpec, seed: int, device: str | torch.device = "cpu", name: str | None = None,
               validate: bool = True) -> Case:
    """The case `spec` describes, drawn from torch.Generator(device).manual_seed(seed).

    The same (spec, seed, device type) always gives bit-identical tensors. validate=False leaves
    Case.validate to the caller: the runner validates every case it runs (a batch, its merged case),
    and on a GPU the check's host syncs cost as much as drawing a small case.
    """
    spec.validate()
    gen = torch.Generator(device=device).manual_seed(seed)
    seq_lens = draw_lengths(spec, gen, device)
    table, num_blocks = draw_block_table(spec, seq_lens, gen, device)
    if spec.pool_blocks is None:
        k_pool, scale_pool = draw_pool(spec, num_blocks, gen, device)
    else:
        k_pool, scale_pool = draw_used_pool(spec, table, seq_lens, num_blocks, gen, device)
    fill_canaries(spec, k_pool, scale_pool, table, seq_lens)
    q, weights = draw_queries(spec, len(seq_lens), gen, device)
    case = Case(name=name or case_name(spec, seed), q=convert(q, Fp8Flavour.E4M3FN, spec.fp8, "q"),
                k_pool=convert(k_pool, Fp8Flavour.E4M3FN, spec.fp8, "k_pool"), scale_pool=scale_pool,
                weights=weights, block_table=table, seq_lens=seq_lens, max_model_len=spec.max_model_len,
                fp8=spec.fp8, meta={"seed": seed, "spec": spec.to_json()})
    return case.validate() if validate else case


def random_cases(spec: CaseSpec, seed: int, count: int, device: str | torch.device = "cpu") -> list[Case]:
    """`count` cases of `spec`; case i is build_case(spec, seed + i), so each one replays alone."""
    return [build_case(spec, seed + i, device) for i in range(count)]


def draw_lengths(spec: CaseSpec, gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """(B + padding,) int64 sequence lengths; padding requests come last with L = 0."""
    if spec.lengths is not None:
        real = torch.tensor(spec.lengths, dtype=torch.int64, device=device)
    elif spec.length_dist == LengthDist.FULL:
        real = torch.full((spec.batch,), spec.max_model_len, dtype=torch.int64, device=device)
    else:
        choices = _length_choices(spec)
        count = choices if isinstance(choices, int) else len(choices)
        real = torch.randint(0, count, (spec.batch,), generator=gen, device=device)
        if not isinstance(choices, int):
            real = torch.tensor(choices, dtype=torch.int64, device=device)[real]
    return torch.cat([real, torch.zeros(spec.padding, dtype=torch.int64, device=device)])


def _length_choices(spec: CaseSpec) -> int | list[int]:
    """The lengths a spec draws from: n for 0, 1, ..., n - 1 (the draw is the length itself: no list
    of 128K Python ints copied to the device per case), else the list."""
    top, n, bs = spec.max_model_len, spec.next_n, spec.block_size
    if spec.length_dist == LengthDist.UNIFORM:
        return top + 1
    if spec.length_dist == LengthDist.SHORT:
        return min(top, 2 * n + 1) + 1
    edges = {0, 1, n - 1, n, n + 1, bs - 1, bs, bs + 1, 2 * bs - 1, 2 * bs, 2 * bs + 1, top - 1, top}
    return sorted(x for x in edges if 0 <= x <= top)


def draw_block_table(spec: CaseSpec, seq_lens: torch.Tensor, gen: torch.Generator,
                     device: str | torch.device) -> tuple[torch.Tensor, int]:
    """(block_table int32 [B, W], pool size).

    Used blocks are a random permutation of the pool; canary blocks are the last ids drawn. With
    pool_blocks the pool has that many blocks, the rest canaries; with high_block_ids the used blocks
    are the pool's top ids (in random order) and the canaries the ids below. With shared_blocks,
    sequence b reuses b-1's full prefix blocks, as prefix caching does.
    """
    batch, bs = len(seq_lens), spec.block_size
    width = -(-spec.max_model_len // bs) + spec.extra_columns
    used = (seq_lens + bs - 1) // bs
    num_own = int(used.sum())
    num_blocks = num_own + spec.canary_blocks if spec.pool_blocks is None else spec.pool_blocks
    if spec.high_block_ids:
        own = num_blocks - num_own + torch.randperm(num_own, generator=gen, device=device)
        canaries = torch.arange(num_blocks - num_own, device=device)
    else:
        ids = torch.randperm(num_blocks, generator=gen, device=device)
        own, canaries = ids[:num_own], ids[num_own:]
    columns = torch.arange(width, device=device)[None, :]
    inside = columns < used[:, None]  # num_own of them: no sequence uses more than `width` blocks
    table = _placed(torch.zeros((batch, width), dtype=torch.int64, device=device), inside, own)
    if spec.shared_blocks:
        _share_prefixes(table, seq_lens, bs)
    table = _placed(table, ~inside, _stale_ids(spec, batch * width - num_own, own, canaries, gen, device))
    return table.to(torch.int32), num_blocks


def _placed(table: torch.Tensor, mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`table` with `values` at the positions `mask` selects, in row-major order: what `table[mask] =
    values` writes, without the host sync a boolean index costs on a GPU (drawing hundreds of cases a
    second, those syncs were much of the time)."""
    if values.numel() == 0:  # then no position is selected
        return table
    order = (mask.flatten().cumsum(0) - 1).clamp(min=0).reshape(mask.shape)
    return torch.where(mask, values[order], table)


def _share_prefixes(table: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> None:
    full = seq_lens // block_size
    for b in range(1, table.shape[0]):  # one step per sequence, not per block or token
        shared = int(min(full[b - 1], full[b]))
        table[b, :shared] = table[b - 1, :shared]


def _stale_ids(spec: CaseSpec, count: int, own: torch.Tensor, canaries: torch.Tensor,
               gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    if spec.stale == Stale.ZERO or count == 0:
        return torch.zeros(count, dtype=torch.int64, device=device)
    pool = canaries if spec.stale == Stale.CANARY or own.numel() == 0 else own
    return pool[torch.randint(0, pool.numel(), (count,), generator=gen, device=device)]


def draw_pool(spec: CaseSpec, num_blocks: int, gen: torch.Generator,
              device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3fn key bytes [NB, bs, D], float32 positive scales [NB, bs]) of every pool slot."""
    shape = (num_blocks, spec.block_size)
    keys = _fp8_values(spec.values, (*shape, spec.head_dim), gen, device)
    return keys, _scales(spec.values, shape, gen, device)


def draw_used_pool(spec: CaseSpec, table: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int,
                   gen: torch.Generator, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """draw_pool for a spec with pool_blocks: keys and scales drawn for the used blocks only (in
    ascending id order), every other block NaN from the start, so a 2^31-byte pool costs one fill."""
    bs = spec.block_size
    used = torch.arange(table.shape[1], device=device)[None, :] < ((seq_lens + bs - 1) // bs)[:, None]
    ids = torch.unique(table[used].long())
    keys, scales = draw_pool(spec, ids.numel(), gen, device)
    k_pool = torch.full((num_blocks, bs, spec.head_dim), Fp8Flavour.E4M3FN.nan_byte, dtype=torch.uint8,
                        device=device)
    scale_pool = torch.full((num_blocks, bs), float("nan"), device=device)
    k_pool[ids], scale_pool[ids] = keys, scales
    return k_pool, scale_pool


def fill_canaries(spec: CaseSpec, k_pool: torch.Tensor, scale_pool: torch.Tensor,
                  table: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """NaN keys and scales in every block no sequence uses and in the slots past each last token."""
    nan = Fp8Flavour.E4M3FN.nan_byte
    bs = spec.block_size
    num_blocks = k_pool.shape[0]
    used = torch.arange(table.shape[1], device=table.device)[None, :] < ((seq_lens + bs - 1) // bs)[:, None]
    # Flags indexed by tensors, not boolean masks (no host sync); what is not marked goes to one
    # scratch entry past the end, so every write of an index writes the same value.
    unused = torch.ones(num_blocks + 1, dtype=torch.bool, device=table.device)
    unused[torch.where(used, table.long(), num_blocks)] = False
    k_pool.masked_fill_(unused[:-1, None, None], nan)
    scale_pool.masked_fill_(unused[:-1, None], float("nan"))
    # Only each sequence's last block has slots past its end: (B, block_size) masks, not (B, W * block_size).
    last = ((seq_lens - 1) // bs).clamp(min=0)
    slot = torch.arange(bs, device=table.device)[None, :]
    past_end = (slot >= (seq_lens - last * bs)[:, None]) & (seq_lens[:, None] > 0)
    blocks = table.long().gather(1, last[:, None])  # (B, 1)
    dead = torch.zeros(num_blocks * bs + 1, dtype=torch.bool, device=table.device)
    dead[torch.where(past_end, blocks * bs + slot, num_blocks * bs)] = True
    k_pool.masked_fill_(dead[:-1].view(num_blocks, bs, 1), nan)
    scale_pool.masked_fill_(dead[:-1].view(num_blocks, bs), float("nan"))


def draw_queries(spec: CaseSpec, batch: int, gen: torch.Generator,
                 device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3fn q bytes [B, next_n, H, D], float32 weights [B * next_n, H])."""
    q = _fp8_values(spec.values, (batch, spec.next_n, spec.heads, spec.head_dim), gen, device)
    shape = (batch * spec.next_n, spec.heads)
    if spec.values == Values.INTEGER:
        weights = torch.randint(-3, 4, shape, generator=gen, device=device).float()
    else:
        weights = torch.randn(shape, generator=gen, device=device) / spec.heads ** 0.5
        if spec.values == Values.HEAVY:
            weights = weights * torch.exp(torch.randn(shape, generator=gen, device=device))
    return q, weights


def _fp8_values(values: Values, shape: tuple[int, ...], gen: torch.Generator,
                device: str | torch.device) -> torch.Tensor:
    if values == Values.INTEGER:
        raw = torch.randint(-4, 5, shape, generator=gen, device=device).float()
    else:
        raw = torch.randn(shape, generator=gen, device=device)
        if values == Values.HEAVY:
            raw = raw * torch.exp(1.5 * torch.randn(shape, generator=gen, device=device))
    return raw.clamp(-COMMON_MAX, COMMON_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def _scales(values: Values, shape: tuple[int, ...], gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    if values == Values.INTEGER:
        return torch.exp2(torch.randint(-4, 3, shape, generator=gen, device=device).float())
    if values == Values.HEAVY:
        return torch.exp2(torch.rand(shape, generator=gen, device=device) * 14 - 10)
    return 0.5 + 1.5 * torch.rand(shape, generator=gen, device=device)
