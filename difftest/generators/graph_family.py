"""The replay family of a case, for `difftest run --graph` (difftest.engine.graph): the cases a serving
engine writes into the buffers it captured a backend's call with, one step after another.

A CUDA graph (or a per-batch `prepare`) is captured on one batch's lengths, and every later step writes
new lengths, block tables and values into the same tensors before replaying it. Every case of a family
therefore has the captured case's tensor shapes (same batch, next_n, heads, head_dim, pool and
max_model_len), its block table as wide as max_model_len needs, and only values changed: lengths that
grow past the captured ones (up to max_model_len), lengths that shrink below them, requests that become
empty, and the captured lengths on another block table. Each step draws fresh q, weights and keys, so a
value read once at capture and kept shows too.
"""

from __future__ import annotations

import dataclasses
import enum
import zlib

import torch

from difftest.core.case import Case
from difftest.core.fp8 import convert
from difftest.core.kinds import Fp8Flavour
from difftest.core.spec import Values
from difftest.generators.tensors import fp8_values, head_weights, key_scales

REPLAY_MARK = "@replay"  # a replay's case name is `<captured case>@replay<i>`


class ReplayStep(str, enum.Enum):
    """What one replay of a family changes against the captured case (all of them: the values too)."""

    GROW = "grow"  # every length one block and one key past the captured one, the longest to the table's end
    SHRINK = "shrink"  # every length halved (rounded up)
    ZERO_LENGTH = "zero-length"  # every other request, from the first, empty
    REMAPPED = "remapped"  # the captured lengths, their blocks elsewhere in the pool


FAMILY = tuple(ReplayStep)  # the replays of every captured case, in order


def replay_name(captured: str, index: int) -> str:
    """The name of replay `index` of the case named `captured`."""
    return f"{captured}{REPLAY_MARK}{index}"


def captured_name(name: str) -> str:
    """The captured case's name of a replay's case name (a name that is no replay's: itself)."""
    return name.partition(REPLAY_MARK)[0]


def captured(case: Case) -> Case:
    """`case` with its block table as wide as max_model_len needs (extra columns on block 0): the buffers
    a family's replays are written into, a length of max_model_len included."""
    width = -(-case.max_model_len // case.block_size)
    extra = width - case.block_table.shape[1]
    if extra <= 0:
        return case
    pad = torch.zeros((case.batch, extra), dtype=case.block_table.dtype, device=case.device)
    return case.lengths_to(dataclasses.replace(case, block_table=torch.cat([case.block_table, pad], dim=1)))


def replay_family(case: Case) -> list[Case]:
    """The replays of `captured(case)`, one per ReplayStep, named replay_name(case.name, i); drawn from a
    seed of the case's name and seed, so a run draws the same family again."""
    base = captured(case)
    gen = torch.Generator(device=base.device)
    gen.manual_seed(zlib.crc32(f"{case.name}/{case.meta.get('seed', 0)}".encode()))
    return [_replay(base, step, replay_name(case.name, index), gen) for index, step in enumerate(FAMILY)]


def step_lengths(lengths: tuple[int, ...], step: ReplayStep, longest: int, block_size: int) -> tuple[int, ...]:
    """The lengths of `step` from the captured `lengths`, none past `longest` (what the buffers hold)."""
    if step == ReplayStep.GROW:
        grown = [min(longest, length + block_size + 1) for length in lengths]
        if grown:
            grown[max(range(len(grown)), key=lambda b: lengths[b])] = longest
        return tuple(grown)
    if step == ReplayStep.SHRINK:
        return tuple((length + 1) // 2 for length in lengths)
    if step == ReplayStep.ZERO_LENGTH:
        return tuple(0 if b % 2 == 0 else length for b, length in enumerate(lengths))
    return lengths


def _replay(base: Case, step: ReplayStep, name: str, gen: torch.Generator) -> Case:
    """One replay of `base`: its step's lengths on a fresh block table, with fresh values."""
    num_blocks = base.k_pool.shape[0]
    longest = min(base.max_model_len, base.block_table.shape[1] * base.block_size) if num_blocks else 0
    lengths = step_lengths(base.lengths, step, longest, base.block_size)
    seq_lens = torch.tensor(lengths, dtype=base.seq_lens.dtype, device=base.device)
    table = _table(base, gen)
    values = _values_of(base)
    q = fp8_values(values, tuple(base.q.shape), gen, base.device)
    weights = head_weights(values, tuple(base.weights.shape), gen, base.device)
    keys, scales = _pool(base, values, table, seq_lens, gen)
    meta = {"graph_replay": step.value, "captured": base.name}
    replay = dataclasses.replace(base, name=name, q=convert(q, Fp8Flavour.E4M3FN, base.fp8, "q"), weights=weights,
                                 k_pool=convert(keys, Fp8Flavour.E4M3FN, base.fp8, "k_pool"), scale_pool=scales,
                                 block_table=table, seq_lens=seq_lens, meta=meta)
    return replay.knowing_lengths(lengths)


def _table(base: Case, gen: torch.Generator) -> torch.Tensor:
    """A block table of `base`'s shape whose entries, row by row, are a random order of the pool's blocks
    (repeated where the table has more entries than the pool has blocks: those blocks are shared)."""
    num_blocks, shape = base.k_pool.shape[0], tuple(base.block_table.shape)
    entries = shape[0] * shape[1]
    if num_blocks == 0:
        return torch.zeros(shape, dtype=base.block_table.dtype, device=base.device)
    order = torch.randperm(num_blocks, generator=gen, device=base.device)
    return order.repeat(-(-entries // num_blocks))[:entries].reshape(shape).to(base.block_table.dtype)


def _pool(base: Case, values: Values, table: torch.Tensor, seq_lens: torch.Tensor,
          gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh e4m3fn keys and scales for every block of `base`'s pool, NaN in each block no used column of
    `table` names (a kernel reading a block it was not given shows)."""
    num_blocks, block_size = base.k_pool.shape[0], base.block_size
    keys = fp8_values(values, (num_blocks, block_size, base.head_dim), gen, base.device)
    scales = key_scales(values, (num_blocks, block_size), gen, base.device)
    used = torch.arange(table.shape[1], device=base.device)[None, :] < (-(-seq_lens // block_size))[:, None]
    unused = torch.ones(num_blocks, dtype=torch.bool, device=base.device)
    unused[table[used].long()] = False
    keys.masked_fill_(unused[:, None, None], Fp8Flavour.E4M3FN.nan_byte)
    scales.masked_fill_(unused[:, None], float("nan"))
    return keys, scales


def _values_of(case: Case) -> Values:
    """The value distribution `case` was drawn with (its spec's), NORMAL for a case with no spec."""
    spec = case.meta.get("spec")
    drawn = spec.get("values") if isinstance(spec, dict) else None
    return Values(drawn) if drawn in {v.value for v in Values} else Values.NORMAL
