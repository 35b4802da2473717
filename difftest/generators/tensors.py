"""How a CaseSpec becomes tensors: seeded torch RNG, on the CPU or a GPU, no Python loop per token."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np
import torch

from difftest.core.case import Case
from difftest.core.errors import require
from difftest.core.fp8 import COMMON_MAX, convert
from difftest.core.kinds import Fp8Flavour
from difftest.generators.spec import CaseSpec, LengthDist, Stale, Values, case_name


def build_case(spec: CaseSpec, seed: int, device: str | torch.device = "cpu", name: str | None = None,
               validate: bool = True) -> Case:
    """The case `spec` describes, drawn from torch.Generator(device).manual_seed(seed).

    The same (spec, seed, device type) always gives bit-identical tensors. validate=False leaves
    Case.validate to the caller: the runner validates every case it runs (a batch, its merged case),
    and on a GPU the check's host syncs cost as much as drawing a small case.
    """
    (case,) = build_cases([(spec, seed)], device, [name])
    return case.validate() if validate else case


def build_cases(draws: Sequence[tuple[CaseSpec, int]], device: str | torch.device = "cpu",
                names: Sequence[str | None] | None = None) -> list[Case]:
    """build_case(spec, seed, device, name, validate=False) for each (spec, seed) of `draws`, bit for bit,
    drawn together; SpecError naming `draws` unless every spec shares heads, head_dim, block_size,
    next_n and fp8.

    Each case's random numbers come from its own generator, in build_case's order. All the rest (one
    host read of every case's lengths, block-table placement, canaries, fp8 conversion) runs once over
    the cases' tensors laid end to end, and each case's tensors are views of those. A GPU spends most of
    a small case's drawing on that rest, about a hundred small operations per case when drawn alone.
    """
    if not draws:
        return []
    specs = [spec.validate() for spec, _seed in draws]
    shape = {(s.heads, s.head_dim, s.block_size, s.next_n, s.fp8) for s in specs}
    require(len(shape) == 1, "draws", sorted(str(s) for s in shape),
            "specs of one heads, head_dim, block_size, next_n and fp8")
    gens = [torch.Generator(device=device).manual_seed(seed) for _spec, seed in draws]
    seq_lens = _joined([draw_lengths(spec, gen, device) for spec, gen in zip(specs, gens, strict=True)])
    lengths = np.array(seq_lens.tolist(), dtype=np.int64)  # the one host read
    requests = np.cumsum([0] + [spec.total_batch for spec in specs])  # each case's first request
    drawn = [_draw_rest(spec, lengths[first:end], gen, device)
             for spec, gen, first, end in zip(specs, gens, requests[:-1], requests[1:], strict=True)]
    return _assembled(specs, [seed for _spec, seed in draws], names or [None] * len(draws), seq_lens, requests,
                      drawn)


@dataclasses.dataclass(frozen=True)
class _Drawn:
    """One case's random draws (block ids, keys, scales, queries) and where its table entries come from."""

    lengths: np.ndarray  # its sequences' lengths, read back
    table_values: torch.Tensor  # int64: its own block ids, then its stale entries
    table_index: np.ndarray  # (B, W): which of table_values each table entry is
    inside: np.ndarray  # (B, W) bool: the entries its sequences use
    keys: torch.Tensor  # uint8 e4m3fn [num_blocks, block_size, D]
    scales: torch.Tensor  # float32 [num_blocks, block_size]
    q: torch.Tensor
    weights: torch.Tensor


def _draw_rest(spec: CaseSpec, lengths: np.ndarray, gen: torch.Generator, device: str | torch.device) -> _Drawn:
    """Everything build_case draws after the lengths, in its order: block ids, stale entries, the pool, q."""
    index, inside = _table_index(spec, lengths)
    num_own = int(inside.sum())
    num_blocks = num_own + spec.canary_blocks if spec.pool_blocks is None else spec.pool_blocks
    if spec.high_block_ids:
        own = num_blocks - num_own + torch.randperm(num_own, generator=gen, device=device)
        canaries = torch.arange(num_blocks - num_own, device=device)
    else:
        ids = torch.randperm(num_blocks, generator=gen, device=device)
        own, canaries = ids[:num_own], ids[num_own:]
    stale = _stale_ids(spec, index.size - num_own, own, canaries, gen, device)
    values = torch.cat([own, stale]) if stale.numel() else own
    if spec.pool_blocks is None:
        keys, scales = draw_pool(spec, num_blocks, gen, device)
    else:
        keys, scales = _used_pool(spec, values, index, inside, num_blocks, gen, device)
    q, weights = draw_queries(spec, len(lengths), gen, device)
    return _Drawn(lengths, values, index, inside, keys, scales, q, weights)


def _table_index(spec: CaseSpec, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index, inside) of a (B, W) block table: its used entries take the case's own block ids in row-major
    order, the others its stale entries in row-major order (index counts past the own ids); with
    shared_blocks, sequence b then takes b-1's entries for their full prefix blocks, as prefix caching does."""
    bs = spec.block_size
    width = -(-spec.max_model_len // bs) + spec.extra_columns
    inside = np.arange(width)[None, :] < ((lengths + bs - 1) // bs)[:, None]
    flat = inside.ravel()
    index = np.where(flat, np.cumsum(flat) - 1, flat.sum() + np.cumsum(~flat) - 1).reshape(inside.shape)
    if spec.shared_blocks:
        full = lengths // bs
        for b in range(1, len(lengths)):  # one step per sequence, not per block or token
            shared = min(full[b - 1], full[b])
            index[b, :shared] = index[b - 1, :shared]
    return index, inside


def _used_pool(spec: CaseSpec, values: torch.Tensor, index: np.ndarray, inside: np.ndarray, num_blocks: int,
               gen: torch.Generator, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """draw_pool for a spec with pool_blocks: keys and scales drawn for the used blocks only (in
    ascending id order), every other block NaN from the start, so a 2^31-byte pool costs one fill."""
    ids = values[_on(np.unique(index[inside]), device)].sort().values
    keys, scales = draw_pool(spec, ids.numel(), gen, device)
    k_pool = torch.full((num_blocks, spec.block_size, spec.head_dim), Fp8Flavour.E4M3FN.nan_byte,
                        dtype=torch.uint8, device=device)
    scale_pool = torch.full((num_blocks, spec.block_size), float("nan"), device=device)
    k_pool[ids], scale_pool[ids] = keys, scales
    return k_pool, scale_pool


def _assembled(specs: list[CaseSpec], seeds: list[int], names: Sequence[str | None], seq_lens: torch.Tensor,
               requests: np.ndarray, drawn: list[_Drawn]) -> list[Case]:
    """The cases, their tensors views of the draws laid end to end; the tables placed and the canaries
    filled once for all of them. `requests[i]` is case i's first request among `seq_lens`."""
    device = seq_lens.device
    entries = np.cumsum([0] + [d.table_index.size for d in drawn])  # each case's table, flattened, end to end
    blocks = np.cumsum([0] + [d.keys.shape[0] for d in drawn])
    index = np.concatenate([d.table_index.ravel() + first for d, first in zip(drawn, entries, strict=False)])
    tables = _joined([d.table_values for d in drawn])[_on(index, device)]
    k_pool, scale_pool = _joined([d.keys for d in drawn]), _joined([d.scales for d in drawn])
    pool_ids = tables + _on(np.repeat(blocks[:-1], np.diff(entries)), device)
    inside = np.concatenate([d.inside.ravel() for d in drawn])
    lengths = np.concatenate([d.lengths for d in drawn])
    _fill_canaries(k_pool, scale_pool, pool_ids, inside, lengths, _row_starts(drawn, entries))
    fp8 = specs[0].fp8
    q = convert(_joined([d.q for d in drawn]), Fp8Flavour.E4M3FN, fp8, "q")
    k_pool = convert(k_pool, Fp8Flavour.E4M3FN, fp8, "k_pool")
    weights, tables = _joined([d.weights for d in drawn]), tables.to(torch.int32)
    rows = requests * specs[0].next_n
    return [Case(name=name or case_name(spec, seed), q=q[requests[i]:requests[i + 1]],
                 k_pool=k_pool[blocks[i]:blocks[i + 1]], scale_pool=scale_pool[blocks[i]:blocks[i + 1]],
                 weights=weights[rows[i]:rows[i + 1]],
                 block_table=tables[entries[i]:entries[i + 1]].view(drawn[i].table_index.shape),
                 seq_lens=seq_lens[requests[i]:requests[i + 1]], max_model_len=spec.max_model_len, fp8=fp8,
                 meta={"seed": seed, "spec": spec.to_json()}).knowing_lengths(drawn[i].lengths)
            for i, (spec, seed, name) in enumerate(zip(specs, seeds, names, strict=True))]


def _row_starts(drawn: list[_Drawn], entries: np.ndarray) -> np.ndarray:
    """Where each sequence's table row starts in the tables laid end to end."""
    return np.concatenate([first + np.arange(d.table_index.shape[0]) * d.table_index.shape[1]
                           for d, first in zip(drawn, entries, strict=False)])


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors end to end; a lone one as it is (a 2^31-byte pool is not copied)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def random_cases(spec: CaseSpec, seed: int, count: int, device: str | torch.device = "cpu") -> list[Case]:
    """`count` cases of `spec`; case i is build_case(spec, seed + i), so each one replays alone."""
    return [build_case(spec, seed + i, device) for i in range(count)]


def draw_lengths(spec: CaseSpec, gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """(B + padding,) int64 sequence lengths; padding requests come last with L = 0."""
    if spec.lengths is not None:
        real = _on_device(tuple(spec.lengths), str(device))
    elif spec.length_dist == LengthDist.FULL:
        real = torch.full((spec.batch,), spec.max_model_len, dtype=torch.int64, device=device)
    else:
        choices = _length_choices(spec)
        count = choices if isinstance(choices, int) else len(choices)
        real = torch.randint(0, count, (spec.batch,), generator=gen, device=device)
        if not isinstance(choices, int):
            real = _on_device(tuple(choices), str(device))[real]
    return torch.cat([real, torch.zeros(spec.padding, dtype=torch.int64, device=device)])


@functools.lru_cache(maxsize=256)
def _on_device(values: tuple[int, ...], device: str) -> torch.Tensor:
    """An int64 tensor of `values` on `device`, made once: a copy to a GPU waits for all the work queued
    before it, and a campaign asks for the same few lists thousands of times. Never written into."""
    return torch.tensor(values, dtype=torch.int64, device=device)


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
    keys = fp8_values(spec.values, (*shape, spec.head_dim), gen, device)
    return keys, key_scales(spec.values, shape, gen, device)


def _fill_canaries(k_pool: torch.Tensor, scale_pool: torch.Tensor, pool_ids: torch.Tensor, inside: np.ndarray,
                  lengths: np.ndarray, row_starts: np.ndarray) -> None:
    """NaN keys and scales in every block no sequence uses and in the slots past each last token.

    pool_ids holds every block-table entry's pool block, the tables' rows end to end (sequence b's row
    starting at row_starts[b]); inside says which entries the sequences use; lengths are theirs.
    Indices, not boolean masks, pick what is written: no host sync on a GPU.
    """
    nan, device = Fp8Flavour.E4M3FN.nan_byte, k_pool.device
    bs = k_pool.shape[1]
    unused = torch.ones(k_pool.shape[0], dtype=torch.bool, device=device)
    unused[pool_ids[_on(np.flatnonzero(inside), device)]] = False
    k_pool.masked_fill_(unused[:, None, None], nan)
    scale_pool.masked_fill_(unused[:, None], float("nan"))
    # Only each sequence's last block has slots past its end.
    last = np.maximum((lengths - 1) // bs, 0)
    past_end = (np.arange(bs)[None, :] >= (lengths - last * bs)[:, None]) & (lengths[:, None] > 0)
    seqs, slots = np.nonzero(past_end)
    dead = pool_ids[_on(row_starts[seqs] + last[seqs], device)] * bs + _on(slots, device)
    k_pool.view(-1, k_pool.shape[2])[dead] = nan
    scale_pool.view(-1)[dead] = float("nan")


def _on(array: np.ndarray, device: str | torch.device) -> torch.Tensor:
    """A host index array as an int64 tensor on `device`."""
    return torch.from_numpy(array.astype(np.int64, copy=False)).to(device)


def draw_queries(spec: CaseSpec, batch: int, gen: torch.Generator,
                 device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3fn q bytes [B, next_n, H, D], float32 weights [B * next_n, H])."""
    q = fp8_values(spec.values, (batch, spec.next_n, spec.heads, spec.head_dim), gen, device)
    return q, head_weights(spec.values, (batch * spec.next_n, spec.heads), gen, device)


def head_weights(values: Values, shape: tuple[int, int], gen: torch.Generator,
                 device: str | torch.device) -> torch.Tensor:
    """float32 [rows, H] head weights: N(0, 1/H) (heavy: times log-normal powers of two), or integers in [-3, 3]."""
    if values == Values.INTEGER:
        return torch.randint(-3, 4, shape, generator=gen, device=device).float()
    weights = torch.randn(shape, generator=gen, device=device) / shape[1] ** 0.5
    if values == Values.HEAVY:
        weights = weights * _log_normal_powers(1.0, shape, gen, device)
    return weights


def fp8_values(values: Values, shape: tuple[int, ...], gen: torch.Generator,
               device: str | torch.device) -> torch.Tensor:
    """e4m3fn bytes of `shape` (q or keys): N(0, 1) (heavy: times log-normal powers of two), or integers in
    [-4, 4]; clamped to the range both fp8 flavours hold, so a case converts to either exactly."""
    if values == Values.INTEGER:
        raw = torch.randint(-4, 5, shape, generator=gen, device=device).float()
    else:
        raw = torch.randn(shape, generator=gen, device=device)
        if values == Values.HEAVY:
            raw = raw * _log_normal_powers(1.5, shape, gen, device)
    return raw.clamp(-COMMON_MAX, COMMON_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def key_scales(values: Values, shape: tuple[int, ...], gen: torch.Generator,
               device: str | torch.device) -> torch.Tensor:
    """float32 positive per-key scales: [0.5, 2) (heavy: 2^-10 .. 2^4 times [1, 2)), or powers of two 2^-4 .. 2^2."""
    if values == Values.INTEGER:
        return _powers_of_two(torch.randint(-4, 3, shape, generator=gen, device=device))
    if values == Values.HEAVY:  # from 2^-10 to 2^4: a power of two times [1, 2)
        octave = _powers_of_two(torch.randint(-10, 4, shape, generator=gen, device=device))
        return octave * (1 + torch.rand(shape, generator=gen, device=device))
    return 0.5 + 1.5 * torch.rand(shape, generator=gen, device=device)


# Heavy tails without exp or exp2: torch's CPU kernels for them are vectorized approximations whose last
# bits depend on the instructions the host has (exp2: its AVX2 and AVX-512 kernels differ; exp: vectorized
# and scalar), so a seed drew other heavy-tailed bytes on one CI host than on another. Powers of two built
# from their bits, and products with them, are exact on every machine.
def _log_normal_powers(sigma: float, shape: tuple[int, ...], gen: torch.Generator,
                       device: str | torch.device) -> torch.Tensor:
    """2^round(sigma * z / ln 2), z standard normal: exp(sigma * z) to the nearest power of two."""
    exponents = torch.round(torch.randn(shape, generator=gen, device=device) * (sigma / np.log(2)))
    return _powers_of_two(exponents.clamp(-100, 100))


def _powers_of_two(exponents: torch.Tensor) -> torch.Tensor:
    """2^e in float32 for integer-valued exponents e in [-126, 127], exactly (the float's bits)."""
    return ((exponents.to(torch.int32) + 127) << 23).view(torch.float32)
