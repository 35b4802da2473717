"""Edge cases derived from a backend's declared envelope (difftest.core.contract.Contract), at the scale of
the device they are for, each with what it costs in memory.

Nothing here knows a kernel or its bugs: every length, batch and pool size follows from declared
facts (tiles, work partition, next_n, heads, head dims, block sizes, max_context, max_pool_bytes)
and from the target (device, SM count, memory). Each case is tagged with the named edge families it
reaches; a family that cannot be reached is an Omission that says why, with the numbers.

Families and how each is derived:

* TILE_MULTIPLES: for every tile t (declared tiles, the partition's unit, the block sizes the kernel
  sees), lengths k*t - 1, k*t, k*t + 1 for k = 1, 2 and, at production scale, the largest k that fits
  the longest context.
* PARTITION_STRADDLE: for every worker count the partition takes (per next_n, from its declared
  workers or the target's SMs): GLOBAL, a request of exactly W units then [0, 1] (one unit too many,
  so a contiguous range spans the empty request whichever end gets the remainder: both orders are
  drawn) and 2W one-unit requests with empty ones between (every range spans one); PER_ROW with k
  programs, rows of m = 1, k - 1, k (+ k + 1, 2k + 1) units ending with a full or a one-token unit, so
  programs get uneven shares and empty chunks, with empty rows between.
* SHORT_LENGTHS: all-empty, length-one and 0..next_n requests (rows with no keys at all).
* PADDING: trailing padding requests whose stale table entries point at other sequences' blocks.
* NEXT_N, HEADS, HEAD_DIMS, BLOCK_SIZES, FP8_FLAVOURS: every supported value (declared, or a
  representative set where the contract takes any) in at least one case, at the nearest shape the
  contract takes.
* POSITIONS_2_15, POSITIONS_2_16: lengths 2^k - 1 .. 2^k + 2, so key positions 2^k - 1, 2^k, 2^k + 1 exist.
* MAX_CONTEXT: every sequence at the envelope's longest context (its max_context, capped by the scale),
  and the MTP overhang column past it.
* UNALIGNED_MAX_MODEL_LEN: max_model_len ending inside a partial last tile: with A the lcm of the tiles,
  (k - 1)*A + r for r = 1, A - 1 and every smaller tile t (aligned to t, not to A), at the context;
  rows ending in the partial tile and before it, each followed by a long row (a whole-tile store of the
  last tile lands on the next row's first positions).
* UNALIGNED_POOL: a pool of a prime number of blocks (a multiple of no tile, unit or power of two), its
  used blocks at the top ids, so the pool's last block is read.
* POOL_2_31_BYTES: pools just under and just over 2^31 bytes, the used blocks at the top ids.
* BLOCK_BASE_2_31_BYTES, BLOCK_BASE_2_32_BYTES: block id * bytes per block (block_size * (D + 4), at the
  block size the kernel is fed) with the top used block starting within one block under 2^k (and
  crossing it), and with the lowest used block starting at the first block start past 2^k; every used
  block full. Past 2^31 a product kept in int32 goes negative; past 2^32 it wraps to a valid address
  of a NaN canary block (a silent wrong read, made loud).
* TOKEN_KEY_2_31_BYTES, TOKEN_KEY_2_32_BYTES: token index * (D + 4), where the declared layout is
  token-interleaved: a used token whose key starts within one row under 2^k and one at or past it
  (reached by the block-base cases, whose blocks are full).
* LOGITS_2_31_ELEMENTS: rows * max_model_len just under and just over 2^31, the last request non-empty.
* LOGITS_ROW_2_31_BYTES, LOGITS_ROW_2_32_BYTES, LOGITS_ROW_2_31_ELEMENTS, LOGITS_ROW_2_32_ELEMENTS:
  row index * max_model_len (times the declared output's element size for bytes): one row starting
  within a row under 2^k and the next at or past it, both with keys.
* Q_ROW_2_31_BYTES, Q_ROW_2_32_BYTES: query row * H * D (fp8 bytes): likewise, at a short context.
  (Not drawn: the weights, row * H * 4 bytes, stay D / 4 times smaller than q, and the block table,
  sequence * width * 4 bytes, next_n * block_size times smaller than the logits.)
* HIGH_BLOCK_IDS: used block ids past 2^16 (and past 2^31 bytes in the pool families).
* STALE_TABLES: columns past each sequence's blocks holding canary ids, block 0, an extra column.
* SHARED_BLOCKS: neighbours sharing full prefix blocks, as prefix caching does.
* VALUES: heavy-tailed and integer-exact values.
* RANDOM: drawn lengths at the target's scale (up to B = 128 at production scale).

Every claim a case makes is checked against what the drawn case has (claim_reason): a case tagged
MAX_CONTEXT has a sequence at the envelope's longest context, one tagged BLOCK_BASE_2_32_BYTES a used
block starting within a block of 2^32, and so on; a family no case reaches is an Omission.

At SMALL scale (CPU CI) the same recipes run at the toy shape (H 32, D 64, block 16,
max_model_len 128: for a contract that takes anything they are difftest.generators.cases' edges and
default specs, the MAX_CONTEXT ones at the envelope's longest context: the declared max_context, up to
SMALL_MAX_CONTEXT); families whose essence is size become Omissions that give the numbers.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
import math
from collections.abc import Callable, Hashable, Iterable
from typing import NamedTuple

from difftest.core import hardware, memory
from difftest.core.contract import Contract
from difftest.core.errors import SpecError
from difftest.core.kinds import CacheLayout, Device, Fp8Flavour, PartitionScope
from difftest.core.memory import Footprint, Shape
from difftest.core.memory import size_text as _size
from difftest.core.schema import MAX_BATCH
from difftest.core.spec import CaseSpec, LengthDist, Stale, Values


class EdgeFamily(str, enum.Enum):
    """A named kind of edge case; a report says which families a run reached."""

    TILE_MULTIPLES = "tile-multiples"
    PARTITION_STRADDLE = "partition-straddle"
    SHORT_LENGTHS = "short-lengths"
    PADDING = "padding"
    NEXT_N = "next-n"
    HEADS = "heads"
    HEAD_DIMS = "head-dims"
    BLOCK_SIZES = "block-sizes"
    FP8_FLAVOURS = "fp8-flavours"
    POSITIONS_2_15 = "positions-2^15"
    POSITIONS_2_16 = "positions-2^16"
    MAX_CONTEXT = "max-context"
    UNALIGNED_MAX_MODEL_LEN = "unaligned-max-model-len"
    UNALIGNED_POOL = "unaligned-pool"
    POOL_2_31_BYTES = "pool-2^31-bytes"
    BLOCK_BASE_2_31_BYTES = "block-base-2^31-bytes"
    BLOCK_BASE_2_32_BYTES = "block-base-2^32-bytes"
    TOKEN_KEY_2_31_BYTES = "token-key-2^31-bytes"
    TOKEN_KEY_2_32_BYTES = "token-key-2^32-bytes"
    LOGITS_2_31_ELEMENTS = "logits-2^31-elements"
    LOGITS_ROW_2_31_BYTES = "logits-row-2^31-bytes"
    LOGITS_ROW_2_32_BYTES = "logits-row-2^32-bytes"
    LOGITS_ROW_2_31_ELEMENTS = "logits-row-2^31-elements"
    LOGITS_ROW_2_32_ELEMENTS = "logits-row-2^32-elements"
    Q_ROW_2_31_BYTES = "q-row-2^31-bytes"
    Q_ROW_2_32_BYTES = "q-row-2^32-bytes"
    HIGH_BLOCK_IDS = "high-block-ids"
    STALE_TABLES = "stale-tables"
    SHARED_BLOCKS = "shared-blocks"
    VALUES = "values"
    RANDOM = "random"


class Scale(str, enum.Enum):
    """How big the cases are: SMALL for a CPU CI run, PRODUCTION for a GPU."""

    SMALL = "small"
    PRODUCTION = "production"


# --------------------------------------------------------------------------- constants

TWO_31 = 2**31
TWO_32 = 2**32
# Where a 32-bit offset breaks: a signed product goes negative past 2^31; an unsigned one (or a signed
# one past 2^32) wraps back to a valid, wrong address.
OFFSET_LIMITS = (TWO_31, TWO_32)
# The toy shape of difftest.generators.cases (SMALL) and the DeepSeek-V3.2 indexer's (PRODUCTION).
SMALL_SHAPE = dict(heads=32, head_dim=64, block_size=16, max_model_len=128)
PRODUCTION_SHAPE = dict(heads=64, head_dim=128, block_size=64)
PRODUCTION_CONTEXT = 131072  # the longest context when the contract names none: past 2^16, 128K as deployed
CONTEXT_CAP = 1 << 20  # a contract may declare more; cases stop here so the oracle's work stays bounded
PRODUCTION_BATCH = 128
# SMALL stays where the CPU's interpreted kernels finish the whole plan in well under 2 minutes: the
# AITER Triton kernels under the interpreter took ~0.2 s per (row, 64-position chunk) on 2 cores.
SMALL_MAX_CONTEXT = 1024
SMALL_MAX_POOL_BYTES = 250 * 10**6
SMALL_MAX_LOGITS = 1 << 22  # rows * max_model_len
SMALL_MAX_QUERY_BYTES = 64 << 20  # rows * H * D fp8 bytes of q
# Representative values where the contract takes any; the first of each scale's shape is preferred.
REPRESENTATIVE = {
    Scale.SMALL: dict(next_n=(1, 2, 3, 4), heads=(32, 64), head_dim=(64, 128), block_size=(1, 16, 64)),
    Scale.PRODUCTION: dict(next_n=(1, 2, 3, 4), heads=(16, 32, 64, 128), head_dim=(64, 128),
                           block_size=(1, 16, 64)),
}


# --------------------------------------------------------------------------- public types

@dataclasses.dataclass(frozen=True)
class Target:
    """What the cases are for: the device, its SM count (0 on a CPU), usable memory, and the scale."""

    device: Device
    sms: int
    memory_bytes: int
    scale: Scale

    @classmethod
    def small_cpu(cls, memory_bytes: int = memory.SMALL_MEMORY) -> Target:
        """A CPU CI run."""
        return cls(Device.CPU, 0, memory_bytes, Scale.SMALL)

    @classmethod
    def production_gpu(cls, sms: int, memory_bytes: int) -> Target:
        """A GPU with `sms` SMs and `memory_bytes` usable."""
        return cls(Device.CUDA, sms, memory_bytes, Scale.PRODUCTION)

    @classmethod
    def probe(cls, device: Device, scale: Scale | None = None) -> Target:
        """This machine's `device`: its SMs (asked of difftest.core.hardware on a GPU) and the memory one
        case may use (difftest.core.memory.usable: on the CPU the least of the host's, the cgroup's and
        the address-space limit's); PRODUCTION on a GPU, SMALL on the CPU by default."""
        sms = hardware.sm_count() if device == Device.CUDA else 0
        return cls(device, sms, memory.usable(device), scale or (Scale.PRODUCTION if device == Device.CUDA
                                                                    else Scale.SMALL))


@dataclasses.dataclass(frozen=True)
class PlannedSpec:
    """A spec and the edge families it reaches; `shrunk` says what fit() changed, empty when nothing."""

    spec: CaseSpec
    families: tuple[EdgeFamily, ...]
    shrunk: str = ""


@dataclasses.dataclass(frozen=True)
class Omission:
    """A family (or one case of it) left out, and why, with the numbers."""

    family: EdgeFamily
    reason: str
    spec_name: str = ""


def estimate_bytes(spec: CaseSpec, contract: Contract | None = None) -> Footprint:
    """What `spec` costs in memory (upper bounds: difftest.core.memory.footprint of its spec_shape), and
    what running a backend of `contract` adds when it is given."""
    return memory.footprint(spec_shape(spec), contract)


def spec_shape(spec: CaseSpec) -> Shape:
    """The sizes of the largest case `spec` draws: its pool as set, or every used block plus the
    canaries; keys drawn for the used blocks only; lengths at their longest."""
    width = -(-spec.max_model_len // spec.block_size) + spec.extra_columns
    blocks = spec.pool_blocks if spec.pool_blocks is not None else spec.max_used_blocks + spec.canary_blocks
    drawn = blocks if spec.pool_blocks is None else min(blocks, spec.max_used_blocks)
    return Shape(spec.total_batch, spec.next_n, spec.heads, spec.head_dim, spec.block_size, spec.max_model_len,
                 width, blocks, drawn, _longest(spec), _key_reads(spec), spec.fp8, spec.values == Values.HEAVY)


def _longest(spec: CaseSpec) -> int:
    """The longest length `spec` can draw."""
    if spec.lengths is not None:
        return max(spec.lengths)
    return min(spec.max_model_len, 2 * spec.next_n + 1) if spec.length_dist == LengthDist.SHORT else spec.max_model_len


def _key_reads(spec: CaseSpec) -> int:
    """The sum of every row's limit, drawn lengths counted at their longest (all equal: one sum, times the
    batch; a fuzz campaign asks this of every case it plans). Explicit lengths are summed per distinct
    length: the 2^31 row families list a hundred thousand requests of a few lengths."""
    if spec.lengths is not None:
        return sum(count * _limits_sum(n, spec.next_n) for n, count in collections.Counter(spec.lengths).items())
    return spec.batch * _limits_sum(_longest(spec), spec.next_n)


def _limits_sum(length: int, next_n: int) -> int:
    """The sum of the limits of one request's next_n rows."""
    return sum(max(length - next_n + j + 1, 0) for j in range(next_n))


def fit(planned: PlannedSpec, budget_bytes: int, *, device: Device = Device.CUDA,
        contract: Contract | None = None) -> PlannedSpec | Omission:
    """`planned` if it fits `budget_bytes` on `device`; else a smaller copy that does, saying what changed;
    else an Omission with the numbers.

    It shrinks by halving the batch (down to 1), then by halving max_model_len, and only where that
    keeps what the case tests: explicit lengths, a set pool size and the size families
    (2^31 pools and logits, high block ids) are never shrunk, and neither is the context of a
    context family (positions, max context, tiles, partitions).
    """
    spec = planned.spec
    need = estimate_bytes(spec, contract).total(device)
    if need <= budget_bytes:
        return planned
    for smaller in _shrinks(planned):
        if estimate_bytes(smaller, contract).total(device) <= budget_bytes:
            changed = [f for f in ("batch", "max_model_len") if getattr(spec, f) != getattr(smaller, f)]
            change = ", ".join(f"{f} {getattr(spec, f)} -> {getattr(smaller, f)}" for f in changed)
            note = f"{change}: {_size(need)} needed, {_size(budget_bytes)} allowed"
            return dataclasses.replace(planned, spec=smaller, shrunk="; ".join(filter(None, (planned.shrunk, note))))
    why = "" if _shrinkable(planned) else " and shrinking it would lose what it tests"
    return Omission(planned.families[0], f"{spec.name} needs {_size(need)} "
                    f"({estimate_bytes(spec, contract).describe(device)}), {_size(budget_bytes)} allowed{why}",
                    spec.name)


_SIZE_FAMILIES = frozenset({EdgeFamily.POOL_2_31_BYTES, EdgeFamily.LOGITS_2_31_ELEMENTS, EdgeFamily.HIGH_BLOCK_IDS,
                            EdgeFamily.BLOCK_BASE_2_31_BYTES, EdgeFamily.BLOCK_BASE_2_32_BYTES,
                            EdgeFamily.TOKEN_KEY_2_31_BYTES, EdgeFamily.TOKEN_KEY_2_32_BYTES,
                            EdgeFamily.LOGITS_ROW_2_31_BYTES, EdgeFamily.LOGITS_ROW_2_32_BYTES,
                            EdgeFamily.LOGITS_ROW_2_31_ELEMENTS, EdgeFamily.LOGITS_ROW_2_32_ELEMENTS,
                            EdgeFamily.Q_ROW_2_31_BYTES, EdgeFamily.Q_ROW_2_32_BYTES})
_CONTEXT_FAMILIES = frozenset({EdgeFamily.MAX_CONTEXT, EdgeFamily.POSITIONS_2_15, EdgeFamily.POSITIONS_2_16,
                               EdgeFamily.TILE_MULTIPLES, EdgeFamily.PARTITION_STRADDLE,
                               EdgeFamily.UNALIGNED_MAX_MODEL_LEN, *_SIZE_FAMILIES})


def _shrinkable(planned: PlannedSpec) -> bool:
    """Whether fewer sequences would still test what `planned` tests: drawn lengths, no set pool, no size family."""
    spec = planned.spec
    return spec.lengths is None and spec.pool_blocks is None and not _SIZE_FAMILIES & set(planned.families)


def _shrinks(planned: PlannedSpec) -> Iterable[CaseSpec]:
    """Ever smaller copies: halved batches, then (where the context is not the point) halved contexts."""
    if not _shrinkable(planned):
        return
    spec = planned.spec
    while spec.batch > 1:
        spec = spec.replace(batch=spec.batch // 2)
        yield spec
    if _CONTEXT_FAMILIES & set(planned.families):
        return
    while spec.max_model_len > spec.block_size:
        spec = spec.replace(max_model_len=spec.max_model_len // 2)
        yield spec


# --------------------------------------------------------------------------- grouping

def envelope_key(contract: Contract) -> Hashable:
    """Equal for contracts whose envelopes plan the same cases, so backends sharing one share cases (and
    the oracle runs once per case). Encoding, layout, mask, fp8 flavour and tolerance do not change
    which cases; the devices do (a contract that excludes the target's device gets none), and so does
    the working memory (a case that fits one backend may not fit another)."""

    def norm(values: Iterable[int] | None) -> tuple[int, ...] | None:
        return None if values is None else tuple(sorted(set(values)))

    return (norm(contract.next_n), norm(contract.block_sizes), norm(contract.head_dims), norm(contract.heads),
            contract.heads_multiple_of, contract.heads_power_of_two, contract.max_context,
            contract.max_pool_bytes, norm(contract.tiles), contract.partition, tuple(sorted(contract.devices)),
            contract.working_memory)


# --------------------------------------------------------------------------- planning

class _Dims(NamedTuple):
    """The four dimensions Contract.shape_reason judges, in its argument order."""

    next_n: int
    heads: int
    head_dim: int
    block_size: int


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What every family builder reads: the contract, the target and the shape cases start from."""

    contract: Contract
    target: Target
    base: CaseSpec  # the nearest shape the contract takes to the scale's preferred one
    context: int  # max_model_len of most cases
    longest: int  # the longest max_model_len any case may have
    align: int  # contexts are rounded up to a multiple of this (tiles, unit, block)

    @property
    def small(self) -> bool:
        return self.target.scale == Scale.SMALL

    @property
    def tiles(self) -> tuple[int, ...]:
        """The tiles (> 1) the kernel is known to use: its declared tiles, its partition's unit and the
        block sizes it is fed (the base's and each declared one)."""
        fed = {self.contract.block_size_for(bs) for bs in (self.base.block_size, *(self.contract.block_sizes or ()))}
        tiles = (*self.contract.tiles, *_unit(self.contract), *fed)
        return tuple(sorted({t for t in tiles if t is not None and t > 1}))

    @property
    def max_context(self) -> int:
        """The envelope's longest context: the declared max_context (up to CONTEXT_CAP), or where none is
        declared the longest this scale draws. What a MAX_CONTEXT case must fill."""
        declared = self.contract.max_context
        if declared is None:
            return SMALL_MAX_CONTEXT if self.small else PRODUCTION_CONTEXT
        return declared

    @property
    def fed_block(self) -> int:
        """The block size the kernel is fed cases of the base's block size at (1 where it re-pages)."""
        fed = self.contract.block_size_for(self.base.block_size)
        assert fed is not None  # the base is a shape the contract takes
        return fed

    def nn(self, wanted: int) -> int:
        """The supported next_n nearest to `wanted` (the larger on a tie: more draft rows)."""
        return _nearest(self.contract.next_n, wanted)

    def batch(self, small: int) -> int:
        """A batch of `small` sequences at SMALL scale, four times that (at most 128) at production scale."""
        return small if self.small else min(4 * small, PRODUCTION_BATCH)

    def ctx(self, length: int) -> int:
        """A max_model_len that holds `length`: rounded up to `align` where that stays within `longest`."""
        rounded = -(-length // self.align) * self.align
        return rounded if rounded <= self.longest else length

    def holding(self, lengths: tuple[int, ...]) -> int:
        """The base's max_model_len, or where `lengths` pass it one that holds them (ctx): a case of fixed lengths
        at 2 * block + 1 is past a small base context at block 64 (129 > 128)."""
        return max(self.base.max_model_len, self.ctx(max(lengths)))

    def spec(self, name: str, next_n: int, **fields: object) -> CaseSpec:
        """The base spec named `name`, at the supported next_n nearest `next_n`, with `fields` replaced."""
        return self.base.replace(name=name, next_n=self.nn(next_n), **fields)

    def dims(self, **pinned: int) -> _Dims | None:
        """The base shape with `pinned` values, the others moved to the nearest the contract takes."""
        want = _Dims(self.base.next_n, self.base.heads, self.base.head_dim, self.base.block_size)._replace(**pinned)
        return _nearest_dims(self.contract, want, tuple(pinned))

    def supported(self, field: str) -> tuple[int, ...]:
        """Declared values of `field`, or the scale's representative ones where the contract takes any,
        kept where some shape the contract takes has them."""
        declared = {"next_n": self.contract.next_n, "heads": self.contract.heads,
                    "head_dim": self.contract.head_dims, "block_size": self.contract.block_sizes}[field]
        values = declared if declared is not None else REPRESENTATIVE[self.target.scale][field]
        return tuple(v for v in sorted(set(values)) if self.dims(**{field: v}) is not None)


Built = list[PlannedSpec | Omission]  # what a family builder returns: cases, or why a case is left out


def envelope_specs(contract: Contract, target: Target) -> tuple[list[PlannedSpec], list[Omission]]:
    """The cases `contract`'s envelope calls for on `target`, each tagged with its families, and what was
    left out and why. Seed-independent: the caller picks seeds. Every spec passes the contract's own
    shape and size checks and fits target.memory_bytes (shrunk by fit() where it may be)."""
    if target.device.value not in contract.devices:
        why = f"the contract's devices {list(contract.devices)} exclude {target.device.value}"
        return [], [Omission(family, why) for family in EdgeFamily]
    plan = _make_plan(contract, target)
    if plan is None:
        why = "no shape (next_n, heads, head_dim, block_size) satisfies the contract"
        return [], [Omission(family, why) for family in EdgeFamily]
    built: Built = [item for builder in _BUILDERS for item in builder(plan)]
    planned, omitted = _admit(plan, built)
    return planned, omitted + _unreached(planned, omitted)


def _make_plan(contract: Contract, target: Target) -> _Plan | None:
    """The base shape (the scale's preferred one, or the nearest the contract takes), the contexts the
    scale allows and the alignment of max_model_len; None when no shape satisfies the contract."""
    small = target.scale == Scale.SMALL
    shape = SMALL_SHAPE if small else PRODUCTION_SHAPE
    want = _Dims(_nearest(contract.next_n, 1), shape["heads"], shape["head_dim"], shape["block_size"])
    dims = _nearest_dims(contract, want)
    if dims is None:
        return None
    declared = contract.max_context
    if small:
        longest = min(declared or SMALL_MAX_CONTEXT, SMALL_MAX_CONTEXT)
        context = min(SMALL_SHAPE["max_model_len"], longest)
    else:
        longest = context = min(declared, CONTEXT_CAP) if declared else PRODUCTION_CONTEXT
    tiles = [t for t in (*contract.tiles, *_unit(contract), dims.block_size) if 1 < t <= longest]
    align = math.lcm(*tiles) if tiles else 1
    align = align if align <= longest else max(tiles)
    base = CaseSpec(batch=4, next_n=dims.next_n, heads=dims.heads, head_dim=dims.head_dim,
                    block_size=dims.block_size, max_model_len=context)
    return _Plan(contract, target, base, context, longest, align)


def _unit(contract: Contract) -> tuple[int, ...]:
    """The partition's unit as a tile, when a partition is declared."""
    return (contract.partition.unit_tokens,) if contract.partition is not None else ()


def _nearest(allowed: Iterable[int] | None, wanted: int) -> int:
    """The value of `allowed` (any when None) nearest to `wanted` on a log scale, the larger on a tie."""
    if allowed is None:
        return wanted
    return min(allowed, key=lambda v: (abs(math.log2(v / wanted)), -v))


def _nearest_dims(contract: Contract, want: _Dims, pinned: tuple[str, ...] = ()) -> _Dims | None:
    """The shape Contract.shape_reason accepts that is nearest `want`, judged dimension by dimension
    (heads first, then head_dim, block_size, next_n); `pinned` dimensions keep their wanted value."""
    options = {
        "next_n": contract.next_n or (want.next_n,),
        "heads": contract.heads or _head_lattice(contract, want.heads),
        "head_dim": contract.head_dims or (want.head_dim,),
        # a wanted block size stays a candidate: the contract may take it by re-paging to tokens
        "block_size": (want.block_size, *(contract.block_sizes or ())),
    }
    for field in pinned:
        options[field] = (getattr(want, field),)
    shapes = [_Dims(*values) for values in itertools.product(*options.values())]
    valid = [d for d in shapes if d.next_n >= 1 and contract.shape_reason(*d) is None]
    order = ("heads", "head_dim", "block_size", "next_n")

    def distance(d: _Dims) -> tuple[float, ...]:
        return (*(abs(math.log2(getattr(d, f) / getattr(want, f))) for f in order), *(-getattr(d, f) for f in order))

    return min(valid, key=distance) if valid else None


def _head_lattice(contract: Contract, wanted: int) -> tuple[int, ...]:
    """Head counts to try where the contract names none: `wanted`, the multiples of heads_multiple_of
    on either side of it, powers of two and their multiples of it, up to 1024 (shape_reason then
    keeps those its constraints allow)."""
    step = contract.heads_multiple_of
    around = {step * (wanted // step), step * -(-wanted // step)}
    return tuple(sorted(h for h in {wanted, *around, *(m * 2**k for k in range(11) for m in (1, step))}
                        if 1 <= h <= 1024))


def _admit(plan: _Plan, built: Built) -> tuple[list[PlannedSpec], list[Omission]]:
    """Specs the contract takes and the target holds (fit), merged where two families built the same
    spec; everything else an Omission per family, with the reason."""
    kept: dict[CaseSpec, PlannedSpec] = {}
    omitted: list[Omission] = []
    for item in built:
        if isinstance(item, Omission):
            omitted.append(item)
            continue
        taken = _within_envelope(plan, item)
        if isinstance(taken, Omission):
            omitted += [dataclasses.replace(taken, family=f) for f in item.families]
            continue
        fitted = fit(taken, plan.target.memory_bytes, device=plan.target.device, contract=plan.contract)
        if isinstance(fitted, Omission):
            omitted += [dataclasses.replace(fitted, family=f) for f in item.families]
            continue
        fitted, unclaimed = _honest(plan, fitted)
        omitted += unclaimed
        if fitted is None:
            continue
        if fitted.spec in kept:
            families = tuple(dict.fromkeys((*kept[fitted.spec].families, *fitted.families)))
            fitted = dataclasses.replace(kept[fitted.spec], families=families)
        kept[fitted.spec] = fitted
    names = [p.spec.name for p in kept.values()]
    assert len(set(names)) == len(names), f"two different specs share a name: {names}"
    return list(kept.values()), omitted


def _honest(plan: _Plan, planned: PlannedSpec) -> tuple[PlannedSpec | None, list[Omission]]:
    """`planned` with only the families its case reaches (claim_reason), and an Omission for each family it
    was built for and does not reach; None when it reaches none."""
    name = planned.spec.name
    reasons = {f: _claim_reason(plan, f, planned.spec) for f in planned.families}
    missed = [Omission(f, f"{name} does not reach it: {why}", name) for f, why in reasons.items() if why]
    kept = tuple(f for f, why in reasons.items() if not why)
    return (dataclasses.replace(planned, families=kept) if kept else None), missed


def _within_envelope(plan: _Plan, planned: PlannedSpec) -> PlannedSpec | Omission:
    """`planned` if the contract and the scale take it; else, for a drawn spec, the first smaller copy
    (as fit() shrinks) they take, saying why; else an Omission with the reason."""
    reason = _reject_reason(plan, planned.spec)
    if not reason:
        return planned
    for smaller in _shrinks(planned):
        if not _reject_reason(plan, smaller):
            changed = [f for f in ("batch", "max_model_len") if getattr(planned.spec, f) != getattr(smaller, f)]
            change = ", ".join(f"{f} {getattr(planned.spec, f)} -> {getattr(smaller, f)}" for f in changed)
            return dataclasses.replace(planned, spec=smaller, shrunk=f"{change}: {reason}")
    return Omission(planned.families[0], f"{planned.spec.name}: {reason}", planned.spec.name)


def _reject_reason(plan: _Plan, spec: CaseSpec) -> str | None:
    """Why the contract or the scale does not take `spec`; None when both do."""
    try:
        spec.validate()
    except SpecError as err:
        if err.field not in _DECLARED_DIMS:  # lengths past max_model_len, a pool too small: the planner's own bug
            raise AssertionError(f"the planner built {spec.name}, which describes no case: {err}") from err
        return str(err)  # a dimension the contract declares that no spec takes (a head_dim no multiple of 16)
    contract = plan.contract
    reason = contract.shape_reason(spec.next_n, spec.heads, spec.head_dim, spec.block_size)
    if reason:
        return reason
    pool = estimate_bytes(spec).pool_bytes
    reason = contract.limits_reason(spec.max_model_len, pool, spec.total_batch, spec.next_n)
    if reason:
        return reason
    rows = spec.total_batch * spec.next_n
    return _scale_reason(plan, spec.max_model_len, pool, rows * spec.max_model_len, rows * spec.heads * spec.head_dim)


# The spec fields a contract's declared shapes set: the only ones whose SpecError leaves a case out.
_DECLARED_DIMS = frozenset(_Dims._fields)


def _scale_reason(plan: _Plan, context: int, pool_bytes: int, logits: int, query_bytes: int = 0) -> str | None:
    """Why SMALL scale leaves out a case of this size (CPU CI keeps contexts, pools, logits and q small)."""
    if not plan.small:
        return None
    if context > plan.longest:
        return f"needs max_model_len {context}; SMALL scale keeps contexts <= {plan.longest} for a CPU run"
    if pool_bytes > SMALL_MAX_POOL_BYTES:
        return f"needs a {_size(pool_bytes)} pool; SMALL scale keeps pools <= {_size(SMALL_MAX_POOL_BYTES)}"
    if query_bytes > SMALL_MAX_QUERY_BYTES:
        return f"needs a {_size(query_bytes)} q; SMALL scale keeps q <= {_size(SMALL_MAX_QUERY_BYTES)}"
    if logits > SMALL_MAX_LOGITS:
        return f"needs {logits} logits; SMALL scale keeps rows * max_model_len <= {SMALL_MAX_LOGITS}"
    return None


def _unreached(planned: list[PlannedSpec], omitted: list[Omission]) -> list[Omission]:
    """An Omission for any family no builder produced anything for, so every family is accounted for."""
    seen = {f for p in planned for f in p.families} | {o.family for o in omitted}
    return [Omission(f, "no case derived from this envelope") for f in EdgeFamily if f not in seen]


# --------------------------------------------------------------------------- families

def _tiles(plan: _Plan) -> Built:
    """TILE_MULTIPLES: k*t - 1, k*t, k*t + 1 for every tile t the kernel is known to use (its tiles, its
    partition unit, the block sizes it sees), k = 1, 2 and at production scale the largest k that fits."""
    tiles = plan.tiles
    if not tiles:
        return [Omission(EdgeFamily.TILE_MULTIPLES, "the contract declares no tiles and its kernel sees block size 1")]
    out: Built = []
    for tile in tiles:
        top = (plan.longest - 1) // tile
        multiples = sorted({1, 2} | (set() if plan.small or top <= 2 else {top}))
        lengths = sorted({k * tile + d for k in multiples for d in (-1, 0, 1)})
        name = "block-boundaries" if tile == plan.base.block_size and plan.small else f"tile-{tile}"
        context = max(plan.context, plan.ctx(lengths[-1]))
        out.append(PlannedSpec(plan.spec(name, 2, lengths=tuple(lengths), max_model_len=context),
                               (EdgeFamily.TILE_MULTIPLES,)))
    return out


def _straddles(plan: _Plan) -> Built:
    """PARTITION_STRADDLE: for each worker count the partition runs with (next_n values grouped by it),
    requests placed so that one worker's range of units spans an empty or one-token request."""
    family, partition = EdgeFamily.PARTITION_STRADDLE, plan.contract.partition
    if partition is None:
        return [Omission(family, "the contract declares no work partition")]
    if partition.workers is None and plan.target.sms < 1:
        return [Omission(family, f"the partition's workers are the GPU's SMs and a {plan.target.device.value} "
                                 "target has none")]
    groups: dict[int, list[int]] = {}
    for next_n in _straddle_next_ns(plan):
        groups.setdefault(partition.worker_count(next_n, plan.target.sms), []).append(next_n)
    out: Built = []
    for workers, next_ns in sorted(groups.items(), reverse=True):
        next_n = min(next_ns)  # the fewest rows per request: the units are the request's own
        recipes = _global_straddles if partition.scope == PartitionScope.GLOBAL else _per_row_straddles
        for name, lengths in recipes(partition.unit_tokens, workers, plan.small):
            out.append(PlannedSpec(plan.spec(f"straddle-w{workers}-{name}", next_n, lengths=lengths,
                                             max_model_len=plan.ctx(max(lengths))), (family,)))
    return out


def _straddle_next_ns(plan: _Plan) -> tuple[int, ...]:
    """next_n values whose worker counts differ: the smallest supported one and every supported one the
    partition halves its workers at."""
    halved = plan.contract.partition.halved_at_next_n if plan.contract.partition else ()
    supported = plan.contract.next_n
    halved = tuple(n for n in halved if supported is None or n in supported)
    return (_nearest(supported, 1), *halved)


def _global_straddles(unit: int, workers: int, small: bool) -> list[tuple[str, tuple[int, ...]]]:
    """Units of every request end to end, cut into `workers` contiguous ranges. A first request of exactly
    `workers` units (its shortest and longest such length) then [0, 1] makes one unit too many, so the
    range holding the remainder spans the empty request when the remainder goes to the last range; the
    mirror order [1, 0, L] does when it goes to the first; 2 * workers one-token requests with empty
    ones between give every range two requests around an empty one."""
    shortest, longest = (workers - 1) * unit + 1, workers * unit
    interleaved = (1, 0) * (2 * workers - 1) + (1,)
    return [("tail-shortest", (shortest, 0, 1)), ("tail-longest", (longest, 0, 1)),
            ("head", (1, 0, shortest)), ("interleaved", interleaved)]


def _per_row_straddles(unit: int, programs: int, small: bool) -> list[tuple[str, tuple[int, ...]]]:
    """Each row's units cut among `programs` programs of its own: rows of m units for m = 1, k - 1, k + 1
    (and k, 2k + 1 at production scale), each once ending in a one-token unit and once in a full one,
    so shares come out uneven around empty chunks; empty rows between them."""
    counts = {1, programs - 1, programs + 1} | (set() if small else {programs, 2 * programs + 1})
    rows = sorted({n for m in counts if m >= 1 for n in ((m - 1) * unit + 1, m * unit)})
    lengths = tuple(x for n in rows for x in (n, 0))[:-1]
    return [(f"per-row-u{unit}", lengths)]


def _short(plan: _Plan) -> Built:
    """SHORT_LENGTHS: all-empty requests, length-one requests, and 0..next_n (rows with no keys)."""
    short, padding = EdgeFamily.SHORT_LENGTHS, EdgeFamily.PADDING
    top = plan.nn(4)
    return [PlannedSpec(plan.spec("all-padding", 2, lengths=(0, 0, 0)), (short, padding)),
            PlannedSpec(plan.spec("length-one", 1, lengths=(1, 1)), (short,)),
            PlannedSpec(plan.spec("shorter-than-next-n", top, lengths=tuple(range(top + 1))), (short,))]


def _tables(plan: _Plan) -> Built:
    """PADDING, STALE_TABLES, SHARED_BLOCKS, MAX_CONTEXT: what a paged table holds around the lengths. The
    full-length case fills the envelope's longest context (at SMALL scale too, up to SMALL_MAX_CONTEXT;
    there, where most cases are shorter, with the overhang column past it, so one case of that length
    is enough for the interpreted kernels); the overhang case is at the context of most cases."""
    c, longest = plan.context, plan.longest
    shared = tuple(round(c * k / 128) for k in (70, 70, 45, 100))  # difftest.generators.cases' lengths at context 128
    too_long = _scale_reason(plan, plan.max_context, 0, 0) or (
        f"the declared max_context {plan.max_context} passes the {CONTEXT_CAP} tokens cases stop at"
        if plan.max_context > longest else None)
    return [
        *([Omission(EdgeFamily.MAX_CONTEXT, f"max-context-{plan.max_context}: {too_long}")] if too_long else []),
        PlannedSpec(plan.spec("max-model-len", 3, length_dist=LengthDist.FULL, batch=2, max_model_len=longest,
                              **({"extra_columns": 1} if c < longest else {})), (EdgeFamily.MAX_CONTEXT,)),
        PlannedSpec(plan.spec("padding-requests", 2, batch=plan.batch(3), padding=plan.batch(3), stale=Stale.OTHER),
                    (EdgeFamily.PADDING, EdgeFamily.STALE_TABLES)),
        PlannedSpec(plan.spec("shared-prefix-blocks", 2, lengths=shared, shared_blocks=True),
                    (EdgeFamily.SHARED_BLOCKS,)),
        PlannedSpec(plan.spec("stale-canary-table", 3, batch=plan.batch(4), extra_columns=1, stale=Stale.CANARY),
                    (EdgeFamily.STALE_TABLES,)),
        PlannedSpec(plan.spec("stale-zero-table", 2, batch=plan.batch(4), extra_columns=1, stale=Stale.ZERO),
                    (EdgeFamily.STALE_TABLES,)),
        PlannedSpec(plan.spec("mtp-overhang-column", 4, lengths=(c, c - 1), extra_columns=1),
                    (EdgeFamily.STALE_TABLES, *((EdgeFamily.MAX_CONTEXT,) if c == plan.max_context else ()))),
    ]


def _values(plan: _Plan) -> Built:
    """VALUES and FP8_FLAVOURS: heavy-tailed and integer-exact values; every fp8 flavour besides e4m3fn
    (the base's, reached by every other case)."""
    out: Built = [PlannedSpec(plan.spec(name, 2, batch=plan.batch(4), values=values), (EdgeFamily.VALUES,))
                  for name, values in (("heavy-tailed-values", Values.HEAVY), ("integer-exact", Values.INTEGER))]
    for flavour in Fp8Flavour:
        if flavour != plan.base.fp8:
            out.append(PlannedSpec(plan.spec(f"{flavour.value}-flavour", 1, batch=plan.batch(3), fp8=flavour),
                                   (EdgeFamily.FP8_FLAVOURS,)))
    return out


def _randoms(plan: _Plan) -> Built:
    """NEXT_N and RANDOM: one drawn spec per supported next_n (uniform lengths at odd next_n, edge lengths
    at even), the first also standing for the base's heads, head dim, block size and e4m3fn; at
    production scale B = 128 drawn over the whole context."""
    out: Built = []
    for index, next_n in enumerate(plan.supported("next_n")):
        dist = LengthDist.EDGES if next_n % 2 == 0 else LengthDist.UNIFORM
        families = (EdgeFamily.NEXT_N, EdgeFamily.RANDOM)
        if index == 0:
            families += (EdgeFamily.HEADS, EdgeFamily.HEAD_DIMS, EdgeFamily.BLOCK_SIZES, EdgeFamily.FP8_FLAVOURS)
        spec = plan.base.replace(name=f"random-mtp{next_n}-{dist.value}", next_n=next_n, length_dist=dist,
                                 batch=plan.batch(4) if plan.small else 32)
        out.append(PlannedSpec(spec, families))
    if not plan.small:
        out.append(PlannedSpec(plan.spec(f"random-b{PRODUCTION_BATCH}", 2, batch=PRODUCTION_BATCH,
                                         length_dist=LengthDist.UNIFORM), (EdgeFamily.RANDOM,)))
    return out


def _dimensions(plan: _Plan) -> Built:
    """HEADS, HEAD_DIMS, BLOCK_SIZES: the DeepSeek indexer's shape (H 64, D 128, block 64, or the nearest
    the contract takes), then a spec for every other supported value not reached yet."""
    out = _deepseek(plan)
    covered = {("heads", plan.base.heads), ("head_dim", plan.base.head_dim), ("block_size", plan.base.block_size)}
    # Block sizes keep their own edge-length cases even where deepseek-heads has one: a block boundary
    # is an edge, a head count is not.
    covered |= {(f, getattr(p.spec, f)) for p in out for f in ("heads", "head_dim")}
    for field, family, name in (("block_size", EdgeFamily.BLOCK_SIZES, "block-size"),
                                ("heads", EdgeFamily.HEADS, "heads"), ("head_dim", EdgeFamily.HEAD_DIMS, "head-dim")):
        for value in plan.supported(field):
            if (field, value) not in covered:
                out.append(PlannedSpec(_one_value(plan, name, field, value), (family,)))
    return out


def _deepseek(plan: _Plan) -> list[PlannedSpec]:
    """H 64 with D and block nearest 128 and 64, unless that is already the production base."""
    if 64 not in plan.supported("heads"):
        return []
    heads = plan.dims(heads=64)
    assert heads is not None  # supported() keeps only values some shape has
    shape = _nearest_dims(plan.contract, heads._replace(head_dim=128, block_size=64), ("heads",)) or heads
    if not plan.small and shape[1:] == (plan.base.heads, plan.base.head_dim, plan.base.block_size):
        return []
    context = max(2 * plan.context, plan.ctx(256)) if plan.small else plan.context
    spec = plan.spec("deepseek-heads", 2, heads=shape.heads, head_dim=shape.head_dim, block_size=shape.block_size,
                     max_model_len=context, batch=plan.batch(2))
    return [PlannedSpec(spec, (EdgeFamily.HEADS, EdgeFamily.HEAD_DIMS))]


def _one_value(plan: _Plan, name: str, field: str, value: int) -> CaseSpec:
    """Edge-distributed lengths at the nearest shape with `field` = `value`: six sequences for a block
    size (its boundaries are the point), two otherwise."""
    shape = plan.dims(**{field: value})
    assert shape is not None  # supported() keeps only values some shape has
    context = max(2 * plan.context, plan.ctx(4 * shape.block_size)) if plan.small else plan.context
    return plan.spec(f"{name}-{value}", 2, heads=shape.heads, head_dim=shape.head_dim, block_size=shape.block_size,
                     max_model_len=context, length_dist=LengthDist.EDGES,
                     batch=plan.batch(6 if field == "block_size" else 2))


def _positions(plan: _Plan) -> Built:
    """POSITIONS_2_15, POSITIONS_2_16: lengths 2^k - 1 .. 2^k + 2, so positions 2^k - 1, 2^k, 2^k + 1 exist."""
    out: Built = []
    for power, family in ((15, EdgeFamily.POSITIONS_2_15), (16, EdgeFamily.POSITIONS_2_16)):
        lengths = tuple(2**power + d for d in (-1, 0, 1, 2))
        out.append(PlannedSpec(plan.spec(f"positions-{2**power}", 1, lengths=lengths,
                                         max_model_len=plan.ctx(lengths[-1])), (family,)))
    return out


def _pools(plan: _Plan) -> Built:
    """POOL_2_31_BYTES and HIGH_BLOCK_IDS: pools of floor(2^31 / block bytes) blocks and one more (every
    offset below 2^31, then the top block's bytes past it), used blocks at the top ids; and a pool whose
    used block ids all pass 2^16."""
    bs, dim = plan.base.block_size, plan.base.head_dim
    block_bytes = bs * (dim + 4)
    tile = _longest_tile(plan)
    lengths = (2 * tile + 1, bs + 1, max(bs - 1, 1), 1, 0)
    out: Built = []
    under = TWO_31 // block_bytes
    for name, blocks in (("under", under), ("over", under + 1)):
        reason = _scale_reason(plan, plan.context, blocks * block_bytes, 0)
        if reason:
            out.append(Omission(EdgeFamily.POOL_2_31_BYTES, f"pool-{name}-2^31-bytes: {reason}"))
            continue
        spec = plan.spec(f"pool-{name}-2^31-bytes", 1, lengths=lengths, max_model_len=plan.ctx(lengths[0]),
                         pool_blocks=blocks, high_block_ids=True)
        out.append(PlannedSpec(spec, (EdgeFamily.POOL_2_31_BYTES, EdgeFamily.HIGH_BLOCK_IDS)))
    short = (2 * bs + 1, bs, 1, 0)
    blocks = 2**16 + 1 + sum(-(-n // bs) for n in short)  # used ids 2^16 + 1 and up
    # On the CPU at the narrowest head_dim the contract takes with this block size: 2^16 blocks of 64 tokens at
    # D 64 are 285 MB, past SMALL_MAX_POOL_BYTES; at D 32, 151 MB.
    narrow = plan.dims(head_dim=min(plan.supported("head_dim")), block_size=bs) if plan.small else None
    shape = {"heads": narrow.heads, "head_dim": narrow.head_dim} if narrow is not None else {}
    out.append(PlannedSpec(plan.spec("high-block-ids-65536", 2, lengths=short, max_model_len=plan.holding(short),
                                     pool_blocks=blocks, high_block_ids=True, **shape), (EdgeFamily.HIGH_BLOCK_IDS,)))
    return out


def _logits(plan: _Plan) -> Built:
    """LOGITS_2_31_ELEMENTS: at the longest context and the largest next_n (fewest requests), B requests
    with B * next_n * max_model_len just under 2^31 and just over, short lengths cycling through 0, 1,
    next_n and a block + 1, and the last request (whose rows lie past 2^31 in the over case) crossing
    a few tiles."""
    family = EdgeFamily.LOGITS_2_31_ELEMENTS
    next_n = max(plan.supported("next_n"))
    context = plan.longest if plan.small else plan.context
    per_request = next_n * context
    reason = _scale_reason(plan, context, 0, TWO_31)
    if reason:
        return [Omission(family, f"logits-2^31: {reason}")]
    bs = plan.base.block_size
    tile = _longest_tile(plan)
    last = min(context, 4 * tile + 1)
    cycle = (0, 1, next_n, bs + 1)
    out: Built = []
    for name, batch in (("under", TWO_31 // per_request), ("over", TWO_31 // per_request + 1)):
        if batch < 1:
            out.append(Omission(family, f"logits-{name}-2^31: one request of next_n {next_n} at max_model_len "
                                        f"{context} already passes 2^31 logits"))
            continue
        if reason := _too_many_requests(plan, batch, next_n, context):
            out.append(Omission(family, f"logits-{name}-2^31: {reason}", f"logits-{name}-2^31"))
            continue
        lengths = (*itertools.islice(itertools.cycle(cycle), batch - 1), last)
        out.append(PlannedSpec(plan.spec(f"logits-{name}-2^31", next_n, lengths=lengths, max_model_len=context),
                               (family,)))
    return out


def _too_many_requests(plan: _Plan, batch: int, next_n: int, context: int) -> str | None:
    """Why `batch` requests at `context` cannot be a case here, judged before their lengths are listed (a
    short declared context makes millions): more than a case holds, or more q and fp32 logits alone than
    the target's memory (fit() judges the rest)."""
    if batch > MAX_BATCH:
        return f"needs {batch} requests at max_model_len {context}; a case holds at most {MAX_BATCH}"
    rows = batch * next_n
    query, logits = rows * plan.base.heads * plan.base.head_dim, rows * context * 4
    if query + logits > plan.target.memory_bytes:
        return (f"needs {rows} rows at max_model_len {context}: {_size(query)} of q and {_size(logits)} of logits "
                f"alone, {_size(plan.target.memory_bytes)} allowed")
    return None


def _unaligned(plan: _Plan) -> Built:
    """UNALIGNED_MAX_MODEL_LEN: with A the lcm of the tiles the kernel uses, max_model_len (k - 1)*A + r for
    r = 1 (a last tile of one position), A - 1 (one position short) and every smaller tile t (aligned to
    t only), k the whole tiles the context holds (2 at least where the longest context allows). Requests
    ending in the partial tile, one short of it, at the last whole tile and in it again: every row's last
    tile is followed by a row with keys at its first positions."""
    family = EdgeFamily.UNALIGNED_MAX_MODEL_LEN
    if not plan.tiles:
        return [Omission(family, "the contract declares no tiles and its kernel sees block size 1: no max_model_len "
                                 "ends inside a partial tile")]
    step = _tile_lcm(plan)
    whole = max(plan.context // step, min(2, plan.longest // step))
    if whole < 1:
        return [Omission(family, f"the longest context {plan.longest} is shorter than the tiles' lcm {step}")]
    out: Built = []
    for rest in sorted({1, step - 1, *(t for t in plan.tiles if t < step)}):
        m = (whole - 1) * step + rest
        out.append(PlannedSpec(plan.spec(f"unaligned-max-model-len-{m}", 2, lengths=(m, m - 1, m - rest, m),
                                         max_model_len=m), (family,)))
    return out


def _unaligned_pool(plan: _Plan) -> Built:
    """UNALIGNED_POOL: a pool of p blocks, p the least prime past every tile, the block size and the blocks
    the case uses plus its canaries (a multiple of nothing a kernel could round to), the used blocks at
    the top ids so the pool's last block is read."""
    bs = plan.base.block_size
    lengths = (2 * bs + 1, bs, 1, 0)
    least = max(sum(-(-n // bs) for n in lengths) + plan.base.canary_blocks, bs, *plan.tiles) + 1
    blocks = _prime_at_least(least)
    return [PlannedSpec(plan.spec(f"unaligned-pool-{blocks}", 2, lengths=lengths, max_model_len=plan.holding(lengths),
                                  pool_blocks=blocks, high_block_ids=True), (EdgeFamily.UNALIGNED_POOL,))]


_BLOCK_BASE = {TWO_31: EdgeFamily.BLOCK_BASE_2_31_BYTES, TWO_32: EdgeFamily.BLOCK_BASE_2_32_BYTES}
_TOKEN_KEY = {TWO_31: EdgeFamily.TOKEN_KEY_2_31_BYTES, TWO_32: EdgeFamily.TOKEN_KEY_2_32_BYTES}


def _block_bases(plan: _Plan) -> Built:
    """BLOCK_BASE_2_31/2_32_BYTES, TOKEN_KEY_2_31/2_32_BYTES: at the block size the kernel is fed (its bytes
    per block block_size * (D + 4)), every used block full, for each limit X: a pool whose top used block
    starts within a block under X and crosses it, and one whose lowest used block starts at the first
    block start past X. The blocks below the used ones are NaN canaries that no sequence touches, so a
    pool past 2^32 bytes costs one fill."""
    bs = plan.fed_block
    block_bytes = bs * (plan.base.head_dim + 4)
    tile = -(-max(plan.tiles, default=bs) // bs) * bs  # the longest tile, in whole blocks
    lengths = (2 * tile, bs, 0, tile)
    used = sum(n // bs for n in lengths)
    interleaved = plan.contract.cache_layout == CacheLayout.TOKEN_INTERLEAVED
    out: Built = [] if interleaved else [
        Omission(_TOKEN_KEY[limit], "the declared layout is block-split: a token's key is its block's base + slot * D, "
                                    "no token index times a row stride (the block-base families reach its products)")
        for limit in OFFSET_LIMITS]
    for limit in OFFSET_LIMITS:
        families = (_BLOCK_BASE[limit], *((_TOKEN_KEY[limit],) if interleaved else ()), EdgeFamily.HIGH_BLOCK_IDS)
        for side, blocks in (("under", (limit - 1) // block_bytes + 1), ("past", -(-limit // block_bytes) + used)):
            name = f"block-base-{side}-{_power(limit)}-bytes"
            reason = _scale_reason(plan, plan.context, blocks * block_bytes, 0)
            if reason:
                out += [Omission(f, f"{name}: {reason}", name) for f in families[:-1]]
                continue
            spec = plan.spec(name, 1, block_size=bs, lengths=lengths, max_model_len=plan.ctx(max(lengths)),
                             pool_blocks=blocks, high_block_ids=True)
            out.append(PlannedSpec(spec, families))
    return out


_LOGITS_ROW = {(TWO_31, "bytes"): EdgeFamily.LOGITS_ROW_2_31_BYTES, (TWO_32, "bytes"): EdgeFamily.LOGITS_ROW_2_32_BYTES,
               (TWO_31, "elements"): EdgeFamily.LOGITS_ROW_2_31_ELEMENTS,
               (TWO_32, "elements"): EdgeFamily.LOGITS_ROW_2_32_ELEMENTS}
_Q_ROW = {TWO_31: EdgeFamily.Q_ROW_2_31_BYTES, TWO_32: EdgeFamily.Q_ROW_2_32_BYTES}


def _logit_rows(plan: _Plan) -> Built:
    """LOGITS_ROW_*: row index * max_model_len, in elements and in bytes of the declared output dtype, at the
    longest context and the largest next_n (fewest requests): _rows_around each limit."""
    context = plan.longest if plan.small else plan.context
    size = plan.contract.output_dtype.itemsize
    out: Built = []
    for (limit, unit), family in _LOGITS_ROW.items():
        stride = context * (size if unit == "bytes" else 1)
        out += _rows_around(plan, family, f"logits-row-{_power(limit)}-{unit}", limit, stride, context, False)
    return out


def _query_rows(plan: _Plan) -> Built:
    """Q_ROW_2_31/2_32_BYTES: query row * H * D (fp8 bytes), at a short context (the point is q, not the
    logits): _rows_around each limit."""
    context = plan.ctx(min(plan.context, 4 * _longest_tile(plan) + 1))
    stride = plan.base.heads * plan.base.head_dim
    return [item for limit, family in _Q_ROW.items()
            for item in _rows_around(plan, family, f"q-row-{_power(limit)}-bytes", limit, stride, context, True)]


def _rows_around(plan: _Plan, family: EdgeFamily, name: str, limit: int, stride: int, context: int,
                 of_query: bool) -> Built:
    """Rows of `stride` units (at the largest next_n, max_model_len `context`) up to the row that starts at
    or past `limit`, the one before it starting within a row under it: both with keys (a few tiles'
    worth); the requests before them short, cycling through 0, 1, next_n and a block + 1. At SMALL scale
    left out for the size of q (`of_query`) or of the logits, whichever the rows are of."""
    next_n = max(plan.supported("next_n"))
    first = (limit - 1) // stride  # the row starting within one row under the limit; the next starts past it
    batch = -(-(first + 2) // next_n)
    rows = batch * next_n
    size = rows * plan.base.heads * plan.base.head_dim if of_query else rows * context
    reason = _scale_reason(plan, context, 0, 0, size) if of_query else _scale_reason(plan, context, 0, size)
    reason = reason or _too_many_requests(plan, batch, next_n, context)
    if reason:
        return [Omission(family, f"{name}: {reason}", name)]
    keyed = first // next_n  # the request holding row `first`; it and the one after hold `last` keys
    last = min(context, 4 * _longest_tile(plan) + 1)
    cycle = tuple(min(n, context) for n in (0, 1, next_n, plan.base.block_size + 1))
    lengths = (*itertools.islice(itertools.cycle(cycle), keyed), *(last,) * (batch - keyed))
    return [PlannedSpec(plan.spec(name, next_n, lengths=lengths, max_model_len=context), (family,))]


_BUILDERS: tuple[Callable[[_Plan], Built], ...] = (_short, _tiles, _tables, _values, _dimensions, _randoms,
                                                     _straddles, _positions, _pools, _logits, _unaligned,
                                                     _unaligned_pool, _block_bases, _logit_rows, _query_rows)


# --------------------------------------------------------------------------- claims

def claim_reason(family: EdgeFamily, spec: CaseSpec, contract: Contract, target: Target) -> str | None:
    """Why a case of `spec` does not reach `family` for a backend of `contract` on `target` (None when it
    does): what the drawn case has (its lengths, its used block ids, its row starts), against the edge
    the family names, derived from the same declared facts the planner used."""
    plan = _make_plan(contract, target)
    if plan is None:
        return "no shape (next_n, heads, head_dim, block_size) satisfies the contract"
    return _claim_reason(plan, family, spec)


def _claim_reason(plan: _Plan, family: EdgeFamily, spec: CaseSpec) -> str | None:
    check = _CLAIMS.get(family)
    return check(plan, spec, family) if check else None


def _known_lengths(spec: CaseSpec) -> tuple[int, ...] | None:
    """Every request's length, padding included, when the spec fixes them (explicit or FULL); None when drawn."""
    if spec.lengths is not None:
        real = spec.lengths
    elif spec.length_dist == LengthDist.FULL:
        real = (spec.max_model_len,) * spec.batch
    else:
        return None
    return (*real, *(0,) * spec.padding)


def _reaches_max_context(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    lengths = _known_lengths(spec)
    longest = "drawn lengths" if lengths is None else f"longest sequence {max(lengths)}"
    if lengths is None or max(lengths) != spec.max_model_len or spec.max_model_len != plan.max_context:
        return (f"its {longest} at max_model_len {spec.max_model_len} is not the envelope's longest context "
                f"{plan.max_context}")
    return None


def _reaches_tile_multiple(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    lengths = set(_known_lengths(spec) or ())
    if any(n - 1 in lengths and n + 1 in lengths and any(n % t == 0 for t in plan.tiles) for n in lengths if n):
        return None
    return f"no lengths k*t - 1, k*t, k*t + 1 for a tile t of {list(plan.tiles)}"


def _reaches_unaligned_end(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    lengths, step = _known_lengths(spec) or (), _tile_lcm(plan) if plan.tiles else 1
    whole = spec.max_model_len - spec.max_model_len % step
    if whole == spec.max_model_len or not any(n > whole for n in lengths) or sum(n > 0 for n in lengths) < 2:
        return (f"max_model_len {spec.max_model_len} with lengths {_shown(lengths)}: no row ends inside a partial "
                f"last tile of {step} followed by another row with keys")
    return None


def _reaches_unaligned_pool(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    divisors = [t for t in (2, *plan.tiles) if spec.pool_blocks is not None and spec.pool_blocks % t == 0]
    if spec.pool_blocks is None or not spec.high_block_ids or divisors:
        return f"a pool of {spec.pool_blocks} blocks (used at the top: {spec.high_block_ids}) divisible by {divisors}"
    return None


def _reaches_position(plan: _Plan, spec: CaseSpec, family: EdgeFamily) -> str | None:
    power = 15 if family == EdgeFamily.POSITIONS_2_15 else 16
    lengths = _known_lengths(spec)
    if lengths is None or max(lengths) < 2**power + 2:
        return f"no sequence has the positions 2^{power} - 1 .. 2^{power} + 1"
    return None


def _reaches_pool_size(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    block_bytes = spec.block_size * (spec.head_dim + 4)
    pool = None if spec.pool_blocks is None else spec.pool_blocks * block_bytes
    if pool is None or abs(pool - TWO_31) >= block_bytes:
        return f"its pool of {pool} bytes is not within a block ({block_bytes} bytes) of 2^31"
    return None


def _used_fed_blocks(plan: _Plan, spec: CaseSpec) -> tuple[range, int] | None:
    """The blocks the sequences use, as the kernel is fed them (tokens where it re-pages), and their bytes
    each; None unless every used block is full and they hold the pool's top ids."""
    lengths, bs = _known_lengths(spec), spec.block_size
    fed = plan.contract.block_size_for(bs)
    if lengths is None or spec.pool_blocks is None or not spec.high_block_ids or spec.shared_blocks or fed is None \
            or any(n % bs for n in lengths):
        return None
    per = bs // fed
    used = sum(n // bs for n in lengths)
    return range((spec.pool_blocks - used) * per, spec.pool_blocks * per), fed * (spec.head_dim + 4)


def _reaches_block_base(plan: _Plan, spec: CaseSpec, family: EdgeFamily) -> str | None:
    limit = next(x for x, f in _BLOCK_BASE.items() if f == family)
    used = _used_fed_blocks(plan, spec)
    if used is None or not _starts_near(*used, limit):
        return f"no used block starts within a block of {_power(limit)} bytes"
    return None


def _reaches_token_key(plan: _Plan, spec: CaseSpec, family: EdgeFamily) -> str | None:
    limit = next(x for x, f in _TOKEN_KEY.items() if f == family)
    used, row = _used_fed_blocks(plan, spec), spec.head_dim + 4
    tokens = None if used is None else range(used[0].start * used[1] // row, used[0].stop * used[1] // row)
    if plan.contract.cache_layout != CacheLayout.TOKEN_INTERLEAVED or tokens is None \
            or not _starts_near(tokens, row, limit):
        return f"no used token-interleaved key starts within a row ({row} bytes) of {_power(limit)} bytes"
    return None


def _starts_near(indices: range, stride: int, limit: int) -> bool:
    """Whether some index in `indices` starts (index * stride) within one stride under `limit` or past it."""
    low = max(indices.start, -(-(limit - stride) // stride))
    return low < min(indices.stop, -(-(limit + stride) // stride))


def _reaches_logits_size(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    lengths = _known_lengths(spec)
    per_request = spec.next_n * spec.max_model_len
    if lengths is None or abs(len(lengths) * per_request - TWO_31) > per_request or not lengths[-1]:
        return "its logits are not within a request of 2^31 elements with the last request non-empty"
    return None


def _reaches_row_start(plan: _Plan, spec: CaseSpec, family: EdgeFamily) -> str | None:
    if family in _Q_ROW.values():
        limit, stride = next(x for x, f in _Q_ROW.items() if f == family), spec.heads * spec.head_dim
    else:
        (limit, unit), = (key for key, f in _LOGITS_ROW.items() if f == family)
        stride = spec.max_model_len * (plan.contract.output_dtype.itemsize if unit == "bytes" else 1)
    lengths = _known_lengths(spec)
    first = (limit - 1) // stride  # starts within one row under the limit; the next one at or past it
    if lengths is None or not all(_row_limit(lengths, spec.next_n, r) > 0 for r in (first, first + 1)):
        return f"no rows of {stride} units with keys starting just under and at or past {_power(limit)}"
    return None


def _row_limit(lengths: tuple[int, ...], next_n: int, row: int) -> int:
    """The causal limit of query row `row` (0 past the last row)."""
    request, j = divmod(row, next_n)
    return max(lengths[request] - next_n + j + 1, 0) if request < len(lengths) else 0


def _reaches_high_ids(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    if spec.pool_blocks is None or not spec.high_block_ids or spec.pool_blocks - 1 <= 2**16:
        return f"its used block ids do not pass 2^16 (a pool of {spec.pool_blocks} blocks)"
    return None


def _reaches_short(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    lengths = _known_lengths(spec)
    return None if lengths is not None and min(lengths) <= spec.next_n else "no request as short as next_n"


def _reaches_padding(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    return None if spec.padding or 0 in (_known_lengths(spec) or ()) else "no zero-length request"


def _reaches_stale(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    lengths = _known_lengths(spec)
    short = lengths is not None and min(lengths) + spec.block_size <= spec.max_model_len
    return None if spec.extra_columns or spec.padding or short else "no table column past a sequence's blocks"


def _reaches_shared(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    lengths = _known_lengths(spec) or ()
    pairs = any(min(a, b) >= spec.block_size for a, b in itertools.pairwise(lengths))
    return None if spec.shared_blocks and pairs else "no neighbours sharing a full block"


def _reaches_straddle(plan: _Plan, spec: CaseSpec, _family: EdgeFamily) -> str | None:
    lengths = _known_lengths(spec) or ()
    between = any(n == 0 and any(lengths[:i]) and any(lengths[i + 1:]) for i, n in enumerate(lengths))
    return None if between else "no empty request between two with keys"


_CLAIMS: dict[EdgeFamily, Callable[[_Plan, CaseSpec, EdgeFamily], str | None]] = {
    EdgeFamily.MAX_CONTEXT: _reaches_max_context, EdgeFamily.TILE_MULTIPLES: _reaches_tile_multiple,
    EdgeFamily.UNALIGNED_MAX_MODEL_LEN: _reaches_unaligned_end, EdgeFamily.UNALIGNED_POOL: _reaches_unaligned_pool,
    EdgeFamily.POSITIONS_2_15: _reaches_position, EdgeFamily.POSITIONS_2_16: _reaches_position,
    EdgeFamily.POOL_2_31_BYTES: _reaches_pool_size, EdgeFamily.LOGITS_2_31_ELEMENTS: _reaches_logits_size,
    **dict.fromkeys(_BLOCK_BASE.values(), _reaches_block_base),
    **dict.fromkeys(_TOKEN_KEY.values(), _reaches_token_key),
    **dict.fromkeys((*_LOGITS_ROW.values(), *_Q_ROW.values()), _reaches_row_start),
    EdgeFamily.HIGH_BLOCK_IDS: _reaches_high_ids, EdgeFamily.SHORT_LENGTHS: _reaches_short,
    EdgeFamily.PADDING: _reaches_padding, EdgeFamily.STALE_TABLES: _reaches_stale,
    EdgeFamily.SHARED_BLOCKS: _reaches_shared, EdgeFamily.PARTITION_STRADDLE: _reaches_straddle,
}  # the others name a value every case of the spec has (a next_n, a head count, a distribution)


# --------------------------------------------------------------------------- helpers

def _tile_lcm(plan: _Plan) -> int:
    """The lcm of the kernel's tiles, or the largest tile where the lcm passes the longest context."""
    step = math.lcm(*plan.tiles)
    return step if step <= plan.longest else max(plan.tiles)


def _longest_tile(plan: _Plan) -> int:
    """The largest of the tiles, the partition's unit and the base block size."""
    return max((*plan.contract.tiles, *_unit(plan.contract), plan.base.block_size))


def _prime_at_least(n: int) -> int:
    """The least prime >= n (n small: a pool's block count)."""
    while n < 2 or any(n % d == 0 for d in range(2, math.isqrt(n) + 1)):
        n += 1
    return n


def _power(limit: int) -> str:
    """'2^31' for 2**31."""
    return f"2^{limit.bit_length() - 1}"


def _shown(values: tuple[int, ...]) -> str:
    """A length list, its first eight entries when long."""
    head = ", ".join(map(str, values[:8]))
    return f"[{head}]" if len(values) <= 8 else f"[{head}, ...] ({len(values)} in all)"

