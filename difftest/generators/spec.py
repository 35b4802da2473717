"""CaseSpec: the small description a case is drawn from (which case), kept apart from the tensors."""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools

from difftest.core.errors import require
from difftest.core.kinds import Fp8Flavour
from difftest.core.schema import SpecModel, validate


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


@dataclasses.dataclass(frozen=True)
class CaseSpec:
    """Structure and distributions of a case. `lengths` fixes every L_b (and B) when given."""

    name: str = "random"
    batch: int = 4
    next_n: int = 1
    heads: int = 32
    head_dim: int = 64
    block_size: int = 16
    max_model_len: int = 256
    length_dist: LengthDist = LengthDist.UNIFORM
    lengths: tuple[int, ...] | None = None
    values: Values = Values.NORMAL
    padding: int = 0  # trailing padding requests (L = 0) after the batch
    shared_blocks: bool = False  # neighbours share their full prefix blocks (prefix caching)
    stale: Stale = Stale.CANARY
    extra_columns: int = 0  # block-table columns past ceil(max_model_len / block_size)
    canary_blocks: int = 2  # unused pool blocks filled with NaN keys and scales
    fp8: Fp8Flavour = Fp8Flavour.E4M3FN
    # Physical blocks in the pool; None: the used ones plus canary_blocks. Every block no sequence
    # uses holds NaN canaries, so a big pool costs one NaN fill, and keys are drawn only for used blocks.
    pool_blocks: int | None = None
    # Used blocks take the pool's highest ids, so in a big pool block_id * bytes_per_block passes 2^31.
    high_block_ids: bool = False

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

    def to_json(self) -> dict[str, object]:
        """Plain JSON values; CaseSpec.from_json inverts it."""
        # Every field is immutable (ints, enums, a tuple), so a shallow dict is enough: asdict's deep
        # copy took 0.4 ms, a tenth of drawing a small case (difftest fuzz draws hundreds a second).
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key, value in out.items():
            if isinstance(value, enum.Enum):
                out[key] = value.value
        out["lengths"] = list(self.lengths) if self.lengths is not None else None
        # Pool fields at their defaults are left out, so every spec written before they existed
        # (reports, bundles, --resume) has the same JSON; from_json fills them back in.
        for key in _POOL_FIELDS:
            if out[key] == _DEFAULTS[key]:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: dict[str, object]) -> CaseSpec:
        """The spec of to_json's JSON (fields left out keep their defaults); SpecError naming the first
        field that does not fit difftest.core.schema.SpecModel ('lengths[2]'), or that validate() refuses."""
        validate(SpecModel, data, root="spec")
        enums = {"length_dist": LengthDist, "values": Values, "stale": Stale, "fp8": Fp8Flavour}
        kwargs = {k: enums[k](v) if k in enums else v for k, v in data.items()}
        if kwargs.get("lengths") is not None:
            kwargs["lengths"] = tuple(kwargs["lengths"])  # type: ignore[arg-type]
        return cls(**kwargs).validate()  # type: ignore[arg-type]


_POOL_FIELDS = ("pool_blocks", "high_block_ids")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CaseSpec)}


def case_name(spec: CaseSpec, seed: int) -> str:
    """'block-boundaries-s3000': the name of the case drawn from (spec, seed), everywhere it is named."""
    return f"{spec.name}-s{seed}"
