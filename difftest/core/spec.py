"""CaseSpec: the small description a case is drawn from (which case), kept apart from the tensors.

CaseSpec is the spec's one definition: its fields, their defaults, and (Annotated, for the readers) the
bounds a spec read from JSON must keep (CaseSpec.from_json, a result's or a case archive's spec, a
matrix suite's, a ledger entry's).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools

from difftest.core.errors import SpecError, require
from difftest.core.kinds import Fp8Flavour
from difftest.core.schema import (
    MAX_BATCH,
    MAX_BLOCK_SIZE,
    MAX_CANARY_BLOCKS,
    MAX_EXTRA_COLUMNS,
    MAX_HEADS,
    MAX_LOGITS,
    MAX_MODEL_LEN,
    MAX_NEXT_N,
    MAX_POOL_BYTES,
    MAX_QUERY_BYTES,
    Bool,
    HeadDim,
    Int,
    IntList,
    Member,
    Record,
    Text,
    bound_text,
    validate,
)


class LengthDist(str, enum.Enum):
    """How sequence lengths L_b are drawn."""

    UNIFORM = "uniform"  # uniform on [0, max_model_len]
    EDGES = "edges"  # from 0, 1, next_n +- 1, block boundaries +- 1, max_model_len - 1, max_model_len
    SHORT = "short"  # uniform on [0, 2 * next_n + 1]: shorter than the MTP window and around it
    FULL = "full"  # every L_b = max_model_len


class Values(str, enum.Enum):
    """The distribution of q, keys, scales and weights."""

    NORMAL = "normal"  # N(0, 1) keys and queries, scales in [0.5, 2), weights N(0, 1/H)
    HEAVY = "heavy"  # log-normal magnitudes (to powers of two) up to the fp8 range, scales over 2^-10 .. 2^4
    INTEGER = "integer"  # small integers and power-of-two scales: every logit exact in float32


class Stale(str, enum.Enum):
    """What block-table columns past a sequence's used width hold."""

    CANARY = "canary"  # ids of NaN canary blocks: a read past the table shows as NaN
    OTHER = "other"  # ids of blocks other sequences use (what a recycled table holds)
    ZERO = "zero"  # block 0


LENGTHS_TEXT = f"a list of 1 to {bound_text(MAX_BATCH)} lengths in [0, max_model_len]"


@dataclasses.dataclass(frozen=True)
class CaseSpec(Record):
    """Structure and distributions of a case. `lengths` fixes every L_b (and B) when given."""

    name: Text(256, 1) = "random"
    batch: Int(1, MAX_BATCH) = 4
    next_n: Int(1, MAX_NEXT_N) = 1
    heads: Int(1, MAX_HEADS) = 32
    head_dim: HeadDim = 64
    block_size: Int(1, MAX_BLOCK_SIZE) = 16
    max_model_len: Int(1, MAX_MODEL_LEN) = 256
    length_dist: Member(LengthDist) = LengthDist.UNIFORM
    lengths: IntList(0, MAX_MODEL_LEN, MAX_BATCH, LENGTHS_TEXT, least=1, as_tuple=True) | None = None
    values: Member(Values) = Values.NORMAL
    padding: Int(0, MAX_BATCH) = 0  # trailing padding requests (L = 0) after the batch
    shared_blocks: Bool = False  # neighbours share their full prefix blocks (prefix caching)
    stale: Member(Stale) = Stale.CANARY
    extra_columns: Int(0, MAX_EXTRA_COLUMNS) = 0  # block-table columns past ceil(max_model_len / block_size)
    canary_blocks: Int(1, MAX_CANARY_BLOCKS) = 2  # unused pool blocks filled with NaN keys and scales
    fp8: Member(Fp8Flavour) = Fp8Flavour.E4M3FN
    # Physical blocks in the pool; None: the used ones plus canary_blocks. Every block no sequence
    # uses holds NaN canaries, so a big pool costs one NaN fill, and keys are drawn only for used blocks.
    pool_blocks: Int(1, MAX_POOL_BYTES) | None = None
    # Used blocks take the pool's highest ids, so in a big pool block_id * bytes_per_block passes 2^31.
    high_block_ids: Bool = False

    @property
    def total_batch(self) -> int:
        return (len(self.lengths) if self.lengths is not None else self.batch) + self.padding

    @functools.cached_property
    def max_used_blocks(self) -> int:
        """An upper bound on the blocks the sequences use: exact with `lengths`, else as if every drawn
        length were the longest its distribution reaches (padding requests use none)."""
        if self.lengths is not None:  # per distinct length: the 2^31 families list 10^5 requests of a few
            return sum(count * -(-n // self.block_size) for n, count in collections.Counter(self.lengths).items())
        longest = min(self.max_model_len, 2 * self.next_n + 1) if self.length_dist == LengthDist.SHORT \
            else self.max_model_len
        return self.batch * -(-longest // self.block_size)

    def validate(self) -> CaseSpec:
        """SpecError naming the first field that cannot describe a case."""
        require(self.batch >= 1, "batch", self.batch, "an integer >= 1")
        require(self.next_n >= 1, "next_n", self.next_n, "an integer >= 1")
        require(self.heads >= 1, "heads", self.heads, "an integer >= 1")
        require(self.head_dim >= 16 and self.head_dim % 16 == 0, "head_dim", self.head_dim,
                "a positive multiple of 16")
        require(self.block_size >= 1, "block_size", self.block_size, "an integer >= 1")
        require(self.max_model_len >= 1, "max_model_len", self.max_model_len, "an integer >= 1")
        require(self.padding >= 0, "padding", self.padding, "an integer >= 0")
        require(self.extra_columns >= 0, "extra_columns", self.extra_columns, "an integer >= 0")
        require(self.canary_blocks >= 1, "canary_blocks", self.canary_blocks,
                "an integer >= 1 (stale entries and padding rows point at canaries)")
        if self.lengths is not None:
            require(len(self.lengths) >= 1, "lengths", self.lengths, "at least one length")
            require(0 <= min(self.lengths) and max(self.lengths) <= self.max_model_len, "lengths", self.lengths,
                    f"every length in [0, max_model_len = {self.max_model_len}]")
        if self.pool_blocks is not None:
            least = self.max_used_blocks + self.canary_blocks
            require(self.pool_blocks >= least, "pool_blocks", self.pool_blocks,
                    f"at least {least}: the blocks the lengths can use plus canary_blocks = {self.canary_blocks}")
        return self

    def replace(self, **changes: object) -> CaseSpec:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def dumped(self, out: dict[str, object]) -> dict[str, object]:
        """The spec's JSON (to_json; CaseSpec.from_json inverts it): pool fields at their defaults are left
        out, so every spec written before they existed (reports, bundles, --resume) has the same JSON;
        from_json fills them back in."""
        return {key: value for key, value in out.items() if key not in _POOL_FIELDS or value != _DEFAULTS[key]}

    @classmethod
    def from_json(cls, data: object, where: str = "") -> CaseSpec:
        """The spec of to_json's JSON (fields left out keep their defaults); SpecError naming the first
        field that does not fit ('lengths[2]'), or that validate() refuses."""
        return validate(cls, data, where, root="spec").validate()

    def checked(self) -> None:
        """Lengths within max_model_len; the cache, q and logits a case of this spec allocates, bounded
        (a spec read from JSON: one a program makes is checked by validate())."""
        within("lengths", self.lengths or (), self.max_model_len)
        rows = self.total_batch * self.next_n
        if rows * self.max_model_len > MAX_LOGITS:
            raise SpecError("logits", rows * self.max_model_len, "(batch + padding) * next_n * max_model_len "
                            f"at most {bound_text(MAX_LOGITS)}")
        if rows * self.heads * self.head_dim > MAX_QUERY_BYTES:
            raise SpecError("q bytes", rows * self.heads * self.head_dim, "(batch + padding) * next_n * heads * "
                            f"head_dim at most {bound_text(MAX_QUERY_BYTES)}")
        blocks = self.pool_blocks if self.pool_blocks is not None else self.max_used_blocks + self.canary_blocks
        if blocks * self.block_size * (self.head_dim + 4) > MAX_POOL_BYTES:
            raise SpecError("pool_blocks" if self.pool_blocks is not None else "pool bytes",
                            self.pool_blocks if self.pool_blocks is not None else
                            blocks * self.block_size * (self.head_dim + 4),
                            f"a cache of at most {bound_text(MAX_POOL_BYTES)} bytes: blocks * block_size * "
                            "(head_dim + 4)")


def within(name: str, lengths: tuple[int, ...] | list[int], max_model_len: int) -> None:
    """SpecError naming the first of `lengths` past max_model_len ('lengths[2]')."""
    if lengths and max(lengths) > max_model_len:
        index = next(i for i, n in enumerate(lengths) if n > max_model_len)
        raise SpecError(f"{name}[{index}]", lengths[index], f"an integer in [0, max_model_len = {max_model_len}]")


_POOL_FIELDS = ("pool_blocks", "high_block_ids")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CaseSpec)}


def case_name(spec: CaseSpec, seed: int) -> str:
    """'block-boundaries-s3000': the name of the case drawn from (spec, seed), everywhere it is named."""
    return f"{spec.name}-s{seed}"
