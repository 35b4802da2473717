"""The schema of everything difftest reads: spec JSON, bundles (bundle.json and case.npz), result
streams and JSON reports (what --resume reads), and ledger TOML.

Every reader validates its document here before it builds anything from it (pydantic v2 models):
each field typed and bounded, unknown fields refused, no silent coercion ("3" is not 3, true is not
1). A document that does not fit is one SpecError naming the first bad field's path
('lengths[2]', '.../bundle.json origin.target', 'resume r.jsonl:3 result.verdict'), its value and
what is allowed; the CLI prints it as one line and exits 2.

A case archive (.npz, a zip of .npy files) is checked from its zip directory and the .npy headers
alone (check_case_archive): the members, their dtypes and shapes against the case's meta, and each
member's declared size against what those shapes take, and their sizes together against the host's
free memory, before any array is decompressed. zipfile never inflates a member past its declared
size, so nothing larger than the meta implies is ever decompressed, and object arrays (pickles) are
refused.

This module imports neither torch nor anything above difftest's bottom layer.
"""

import json
import math
import os
import re
import stat
import struct
import types
import typing
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, create_model, model_validator
from pydantic_core import PydanticCustomError

from difftest.core.errors import SpecError
from difftest.core.hardware import DeviceKind, available_memory
from difftest.core.kinds import (
    CacheLayout,
    CaseKind,
    Device,
    Fp8Flavour,
    Isolation,
    LengthEncoding,
    MetamorphicRelation,
    OperationKind,
    OracleKind,
    SanitizerTool,
    TimedRegion,
    TimingMethod,
)
from difftest.core.text import printable
from difftest.core.verdict import Verdict

# --------------------------------------------------------------------------- bounds
#
# A spec or case past these is a typo or an attack, not a test: each bound is far above what any
# deployed model or kernel uses, and the products below keep what a case allocates in memory one
# machine can hold.

# Requests in a case. Loose on purpose: the LOGITS_2_31_ELEMENTS edge family (difftest.generators.envelope)
# draws 2^31 / (next_n * max_model_len) requests, 2^21 at next_n 1 and a 1K context. What the
# requests cost is bounded by MAX_LOGITS, MAX_QUERY_BYTES and MAX_POOL_BYTES.
MAX_BATCH = 1 << 24
MAX_NEXT_N = 16  # MTP draft positions: deployed models use 1..4 (DeepSeek-V3.2's indexer 1 or 2)
MAX_HEADS = 1024  # indexer heads: DeepSeek-V3.2 has 64, the envelopes go to 128
MAX_HEAD_DIM = 1024  # a multiple of 16: the indexer's is 128, the kernels take 32..256
MAX_BLOCK_SIZE = 4096  # tokens per cache block: 1..256 in vLLM and the kernels (DeepGEMM's 64)
# 4M tokens: 32x a deployed 128K context, 16x DeepGEMM's declared 256K, 4x the envelope's CONTEXT_CAP.
MAX_MODEL_LEN = 1 << 22
MAX_EXTRA_COLUMNS = 1 << 16  # block-table columns past the widest sequence's
MAX_CANARY_BLOCKS = 1 << 24
# Bytes of the paged cache, num_blocks * block_size * (head_dim + 4): 1 TiB, 7x an H200's memory; the
# pool-past-2^31-bytes family needs 2^31 and one block.
MAX_POOL_BYTES = 1 << 40
MAX_LOGITS = 1 << 36  # rows * max_model_len: 256 GiB of float32 logits, 32x the logits-past-2^31 family
MAX_QUERY_BYTES = 1 << 36  # fp8 bytes of q: rows * heads * head_dim
MAX_ROWS = MAX_BATCH * 2 * MAX_NEXT_N  # (batch + padding) * next_n
MAX_REPEAT = 1000  # launches per case: difftest.engine.config.MAX_REPEAT (a sibling module, restated)
MAX_TIME = 1000  # timed launches per case: difftest.engine.config.MAX_TIME (likewise)
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed takes
MAX_NAME = 1024  # backend, case, family and spec names; 'package.module:object' targets
MAX_TEXT = 1 << 24  # free text: reasons, notes, sanitizer output, descriptions
MAX_COMMAND = 1 << 28  # a recorded command line: a --spec may list every length
MAX_ITEMS = 1 << 20  # list entries that are not per-row or per-request (names, findings, results)
MAX_DOCUMENT_BYTES = 1 << 32  # a JSON report, stream, bundle.json or ledger read whole
MAX_NPY_HEADER = 1 << 16  # an .npy header (numpy writes ~128 bytes)
MAX_DEFLATE_RATIO = 1032  # deflate's largest expansion: a member cannot inflate to more than this many times its size
LOAD_FACTOR = 3  # host memory a case archive's arrays take while Case.load reads them, per declared byte
META_FIXED_CHARS = 1 << 16  # the JSON meta of a case, less its per-request lists
META_CHARS_PER_REQUEST = 24  # seq_lens and spec.lengths: up to 7 digits and ', ' each, with room

# Enum values of modules this one may not import (difftest.generators.spec, difftest.engine.stability); the schema
# tests check that they agree.
LENGTH_DISTS = ("uniform", "edges", "short", "full")
VALUE_DISTS = ("normal", "heavy", "integer")
STALES = ("canary", "other", "zero")
STABILITY_KINDS = ("bitwise-stable", "stable-within-tolerance", "unstable")
MASK_PATTERNS = ("no-window", "constant-offset", "per-sequence-length", "reversed-draft-rows", "mtp-mirrored",
                 "tile-truncated", "shifted-request", "tail-not-cleaned", "unknown")  # difftest.engine.explain.Pattern
LEGACY_MASK_PATTERNS = ("shifted-by-one-request",)  # difftest.engine.explain.LEGACY_PATTERNS: older reports' values
ROUNDINGS = ("down", "up")  # difftest.engine.explain.Rounding
DIFFERENCES_KEPT = 8  # difftest.engine.explain.DIFFERENCES_KEPT
SELFTEST_STATUSES = ("caught", "missed", "passed", "false positive")  # difftest.workflows.selftest.Status
MASK_LIMITS = 256  # difftest.engine.comparison.MASK_LIMITS: wrong-mask rows whose limits a comparison records
MAX_TRACEBACK = 1 << 14  # difftest.engine.guards.MAX_TRACEBACK_CHARS: characters of a result's traceback
DEFAULT_TOPK = 2048  # difftest.core.contract.DEFAULT_TOPK: a comparison's top-k before it recorded its k
# CaseSpec's defaults (difftest.generators.spec.CaseSpec), likewise restated and checked.
SPEC_DEFAULTS: dict[str, Any] = {
    "name": "random", "batch": 4, "next_n": 1, "heads": 32, "head_dim": 64, "block_size": 16,
    "max_model_len": 256, "length_dist": "uniform", "lengths": None, "values": "normal", "padding": 0,
    "shared_blocks": False, "stale": "canary", "extra_columns": 0, "canary_blocks": 2, "fp8": "e4m3fn",
    "pool_blocks": None, "high_block_ids": False,
}
ISSUE = re.compile(r"https?://\S+|[\w.-]+/[\w.-]+#\d+")
ISSUE_TEXT = "the tracking issue: a URL (https://...) or 'owner/repo#N'"
STREAM_TEXT = 'a JSON report, or JSONL lines {"run": ...} / {"result": ...}'


def _n(value: int | float) -> str:
    """A bound as people read it: powers of two from 2^16 up as 2^k."""
    if isinstance(value, int) and value >= 1 << 16 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    if isinstance(value, int) and value + 1 >= 1 << 16 and (value + 1) & value == 0:
        return f"2^{value.bit_length()} - 1"
    return str(value)


# --------------------------------------------------------------------------- leaf rules

class Rule:
    """A leaf check and the words for what it allows; as an annotation, a pydantic validator."""

    def __init__(self, check: Callable[[Any], bool], expected: str) -> None:
        self.check, self.expected = check, expected

    def __call__(self, value: Any) -> Any:
        try:
            fits = bool(self.check(value))
        except (TypeError, ValueError, OverflowError, RecursionError):
            fits = False
        if not fits:
            raise PydanticCustomError("difftest", "{expected}", {"expected": self.expected})
        return value

    def __repr__(self) -> str:
        return f"Rule({self.expected!r})"

    def type(self, python: Any = Any) -> Any:
        """The annotation that validates with this rule."""
        return Annotated[python, PlainValidator(self), self]


def _is_int(value: Any) -> bool:
    return type(value) is int


def _in(value: Any, low: float, high: float) -> bool:
    """A JSON number (not a bool) in [low, high]; NaN never is."""
    if type(value) is int:
        return low <= value <= high
    return type(value) is float and low <= value <= high


def Int(low: int, high: int, what: str = "an integer") -> Any:
    return Rule(lambda v: _is_int(v) and low <= v <= high, f"{what} in [{_n(low)}, {_n(high)}]").type(int)


def Number(low: float = 0.0, high: float = math.inf, special: bool = False) -> Any:
    """A finite JSON number in [low, high]; with `special`, also inf and NaN as to_jsonable writes them
    ('inf', '-inf', 'nan') or as JSON's Infinity and NaN."""
    top = "inf)" if high == math.inf else f"{_n(high)}]"

    def check(value: Any) -> bool:
        if special and (value in ("inf", "-inf", "nan") or (type(value) is float and not math.isfinite(value))):
            return True
        return _in(value, low, high) and (type(value) is int or math.isfinite(value))

    return Rule(check, f"a number in [{_n(low)}, {top}" + (", or 'inf', '-inf', 'nan'" if special else "")).type()


def Text(high: int = MAX_TEXT, low: int = 0, what: str | None = None) -> Any:
    words = what or (f"a string of at most {_n(high)} characters" if low == 0
                     else f"a string of {low} to {_n(high)} characters")
    return Rule(lambda v: type(v) is str and low <= len(v) <= high, words).type(str)


def Filled(what: str, high: int = MAX_NAME) -> Any:
    """A string with something besides blanks in it."""
    return Rule(lambda v: type(v) is str and v.strip() != "" and len(v) <= high, what).type(str)


def OneOf(values: Any) -> Any:
    allowed = [v.value if hasattr(v, "value") else v for v in values]
    return Rule(lambda v: type(v) is str and v in allowed, f"one of {allowed}").type(str)


Bool = Rule(lambda v: type(v) is bool, "true or false").type(bool)
Name = Text(MAX_NAME)
Seed = Int(*SEED_RANGE)
Count = Int(0, (1 << 63) - 1)
RowIndex = Int(0, MAX_ROWS)
JsonFloat = Number(-math.inf, math.inf, special=True)
NonNegative = Number(0.0, math.inf, special=True)
Devices = OneOf(Device)
Verdicts = OneOf(Verdict)


class Expect:
    """What a container field (a list, a table) allows, for the errors pydantic raises on its own."""

    def __init__(self, expected: str) -> None:
        self.expected = expected


def ListOf(item: Any, high: int, what: str, low: int = 0) -> Any:
    return Annotated[list[item], Field(min_length=low, max_length=high), Expect(what)]


def TableOf(key: Any, value: Any, what: str) -> Any:
    return Annotated[dict[key, value], Expect(what)]


HeadDim = Rule(lambda v: _is_int(v) and 16 <= v <= MAX_HEAD_DIM and v % 16 == 0,
               f"a multiple of 16 in [16, {MAX_HEAD_DIM}]").type(int)


def IntList(low: int, high: int, most: int, what: str, least: int = 0) -> Any:
    """A list of `least` to `most` integers in [low, high]: checked at C speed (a comparison may list
    millions of rows); a bad entry is named by its index ('lengths[2]')."""
    item = f"an integer in [{_n(low)}, {_n(high)}]"

    def check(value: Any) -> Any:
        if type(value) is not list or not least <= len(value) <= most:
            raise PydanticCustomError("difftest", "{expected}", {"expected": what})
        if value and not (all(type(v) is int for v in value) and low <= min(value) and max(value) <= high):
            index, bad = next((i, v) for i, v in enumerate(value) if not (_is_int(v) and low <= v <= high))
            raise SpecError(f"[{index}]", shown(bad), item)
        return value

    return Annotated[list[int], PlainValidator(check), Expect(what)]


SpecLengths = IntList(0, MAX_MODEL_LEN, MAX_BATCH, f"a list of 1 to {_n(MAX_BATCH)} lengths in [0, max_model_len]",
                      least=1)
Rows = IntList(0, MAX_ROWS, MAX_ROWS, f"a list of row indices in [0, {_n(MAX_ROWS)}]")
Names = ListOf(Name, MAX_ITEMS, f"a list of names of at most {_n(MAX_NAME)} characters")


# --------------------------------------------------------------------------- models

def _strip(annotation: Any) -> tuple[Any, bool]:
    """`annotation` without its `| None`, and whether it had one."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _base(annotation: Any) -> Any:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation



class Model(BaseModel):
    """A JSON object with exactly these fields, each checked strictly."""

    model_config = ConfigDict(extra="forbid", strict=True)
    what: ClassVar[str] = "a JSON object"  # what the object as a whole must be
    unknown_name: ClassVar[str | None] = None  # the word after the object's path naming its unknown keys
    unknown_expected: ClassVar[str | None] = None  # what its keys may be; default: its fields, sorted
    legacy_fields: ClassVar[frozenset[str]] = frozenset()  # fields only older documents hold (read, never written)


class SpecModel(Model):
    """difftest.generators.spec.CaseSpec as JSON (CaseSpec.to_json); a field left out keeps its default."""

    what: ClassVar[str] = "a JSON object of CaseSpec fields"
    name: Text(256, 1) = SPEC_DEFAULTS["name"]
    batch: Int(1, MAX_BATCH) = SPEC_DEFAULTS["batch"]
    next_n: Int(1, MAX_NEXT_N) = SPEC_DEFAULTS["next_n"]
    heads: Int(1, MAX_HEADS) = SPEC_DEFAULTS["heads"]
    head_dim: HeadDim = SPEC_DEFAULTS["head_dim"]
    block_size: Int(1, MAX_BLOCK_SIZE) = SPEC_DEFAULTS["block_size"]
    max_model_len: Int(1, MAX_MODEL_LEN) = SPEC_DEFAULTS["max_model_len"]
    length_dist: OneOf(LENGTH_DISTS) = SPEC_DEFAULTS["length_dist"]
    lengths: SpecLengths | None = None
    values: OneOf(VALUE_DISTS) = SPEC_DEFAULTS["values"]
    padding: Int(0, MAX_BATCH) = SPEC_DEFAULTS["padding"]
    shared_blocks: Bool = SPEC_DEFAULTS["shared_blocks"]
    stale: OneOf(STALES) = SPEC_DEFAULTS["stale"]
    extra_columns: Int(0, MAX_EXTRA_COLUMNS) = SPEC_DEFAULTS["extra_columns"]
    canary_blocks: Int(1, MAX_CANARY_BLOCKS) = SPEC_DEFAULTS["canary_blocks"]
    fp8: OneOf(Fp8Flavour) = SPEC_DEFAULTS["fp8"]
    pool_blocks: Int(1, MAX_POOL_BYTES) | None = None
    high_block_ids: Bool = SPEC_DEFAULTS["high_block_ids"]

    @model_validator(mode="after")
    def _fits(self) -> "SpecModel":
        """Lengths within max_model_len; the cache, q and logits a case of this spec allocates, bounded."""
        _within("lengths", self.lengths or [], self.max_model_len)
        requests = (len(self.lengths) if self.lengths is not None else self.batch) + self.padding
        rows = requests * self.next_n
        if rows * self.max_model_len > MAX_LOGITS:
            raise SpecError("logits", rows * self.max_model_len, f"(batch + padding) * next_n * max_model_len "
                            f"at most {_n(MAX_LOGITS)}")
        if rows * self.heads * self.head_dim > MAX_QUERY_BYTES:
            raise SpecError("q bytes", rows * self.heads * self.head_dim, f"(batch + padding) * next_n * heads * "
                            f"head_dim at most {_n(MAX_QUERY_BYTES)}")
        blocks = self.pool_blocks if self.pool_blocks is not None else self._used_blocks() + self.canary_blocks
        pool = blocks * self.block_size * (self.head_dim + 4)
        if pool > MAX_POOL_BYTES:
            raise SpecError("pool_blocks" if self.pool_blocks is not None else "pool bytes",
                            self.pool_blocks if self.pool_blocks is not None else pool,
                            f"a cache of at most {_n(MAX_POOL_BYTES)} bytes: blocks * block_size * (head_dim + 4)")
        return self

    def _used_blocks(self) -> int:
        """CaseSpec.max_used_blocks."""
        if self.lengths is not None:
            return sum(-(-n // self.block_size) for n in self.lengths)
        longest = min(self.max_model_len, 2 * self.next_n + 1) if self.length_dist == "short" else self.max_model_len
        return self.batch * -(-longest // self.block_size)


def _within(name: str, lengths: list[int], max_model_len: int) -> None:
    """SpecError naming the first of `lengths` past max_model_len."""
    if lengths and max(lengths) > max_model_len:
        index = next(i for i, n in enumerate(lengths) if n > max_model_len)
        raise SpecError(f"{name}[{index}]", lengths[index], f"an integer in [0, max_model_len = {max_model_len}]")


class MismatchModel(Model):
    """difftest.core.verdict.Mismatch."""

    what: ClassVar[str] = "a JSON object of Mismatch fields"
    row: RowIndex
    position: Int(0, MAX_MODEL_LEN)
    expected: JsonFloat
    got: JsonFloat
    kind: Verdicts


def _mask_limit(value: Any) -> bool:
    """[row, oracle limit, apparent limit or null], each limit in [0, max_model_len]."""
    return (type(value) is list and len(value) == 3 and _is_int(value[0]) and 0 <= value[0] <= MAX_ROWS
            and _is_int(value[1]) and 0 <= value[1] <= MAX_MODEL_LEN
            and (value[2] is None or (_is_int(value[2]) and 0 <= value[2] <= MAX_MODEL_LEN)))


MaskLimits = ListOf(Rule(_mask_limit, "[row, oracle limit, apparent limit or null]").type(), MASK_LIMITS,
                    f"a list of at most {MASK_LIMITS} [row, oracle limit, apparent limit or null]")


class RelationModel(Model):
    """difftest.engine.explain.Relation."""

    what: ClassVar[str] = "a JSON object of Relation fields"
    pattern: OneOf(MASK_PATTERNS)
    offset: Int(-MAX_MODEL_LEN, MAX_MODEL_LEN) | None = None
    shift: Int(-2 * MAX_BATCH, 2 * MAX_BATCH) | None = None
    tile: Int(2, MAX_MODEL_LEN) | None = None
    rounding: OneOf(ROUNDINGS) | None = None


class ExampleModel(Model):
    """difftest.engine.explain.Example."""

    what: ClassVar[str] = "a JSON object of Example fields"
    row: RowIndex
    oracle: Int(0, MAX_MODEL_LEN)
    kernel: Int(0, MAX_MODEL_LEN) | None
    request: Int(0, 2 * MAX_BATCH) | None = None
    draft_row: Int(0, MAX_NEXT_N - 1) | None = None
    length: Int(0, MAX_MODEL_LEN) | None = None


def _difference(value: Any) -> bool:
    """[kernel - oracle limit or null, recorded rows]."""
    return (type(value) is list and len(value) == 2
            and (value[0] is None or (_is_int(value[0]) and -MAX_MODEL_LEN <= value[0] <= MAX_MODEL_LEN))
            and _is_int(value[1]) and 1 <= value[1] <= MASK_LIMITS)


class ExplanationModel(Model):
    """difftest.engine.explain.Explanation. Reports written before relations were fitted hold `pattern`
    (one of MASK_PATTERNS or LEGACY_MASK_PATTERNS) and `description` instead of `relation`."""

    what: ClassVar[str] = "a JSON object of Explanation fields"
    legacy_fields: ClassVar[frozenset[str]] = frozenset({"pattern", "description"})
    relation: RelationModel | None = None
    pattern: OneOf(MASK_PATTERNS + LEGACY_MASK_PATTERNS) | None = None
    description: Text() | None = None
    explained: Count
    rows: Int(0, MASK_LIMITS)
    selective: Bool = False
    next_n: Int(1, MAX_NEXT_N) | None = None
    draft_rows: ListOf(Int(0, MAX_NEXT_N - 1), MAX_NEXT_N, f"a list of at most {MAX_NEXT_N} draft rows") = []
    example: ExampleModel | None = None
    right_windows: Count = 0
    holes: Int(0, MASK_LIMITS) = 0
    differences: ListOf(Rule(_difference, "[kernel - oracle limit or null, rows]").type(), DIFFERENCES_KEPT,
                        f"a list of at most {DIFFERENCES_KEPT} [kernel - oracle limit or null, rows]") = []
    alternatives: ListOf(RelationModel, len(MASK_PATTERNS) * 8, "a list of Relation objects") = []

    @model_validator(mode="after")
    def _one_relation(self) -> "ExplanationModel":
        if (self.relation is None) == (self.pattern is None):
            raise SpecError("relation", None if self.relation is None else "both", "a relation, or the pattern "
                            "of an older report (one of the two)")
        return self


class ComparisonModel(Model):
    """difftest.engine.comparison.Comparison."""

    what: ClassVar[str] = "a JSON object of Comparison fields"
    rows: Int(0, MAX_ROWS)
    mask_rows: Rows
    nan_rows: Rows
    unwritten_rows: Rows
    value_rows: Rows
    positions_differing: Count
    max_abs_err: NonNegative
    max_rel_err: NonNegative
    # A mean of per-row ratios in [0, 1]; its float sum may round a hair past 1. null: no row's window is
    # longer than the top-k (not applicable).
    topk_overlap: Rule(lambda v: v == "nan" or (type(v) is float and math.isnan(v)) or _in(v, -1e-9, 1 + 1e-9),
                       "a number in [0, 1], or 'nan'").type() | None
    first_mismatch: MismatchModel | None
    verdict: Verdicts
    # Reports written before failures explained themselves have none of these.
    mask_limits: MaskLimits = []  # pydantic copies a mutable default
    explanation: ExplanationModel | None = None
    mask_strip: Text() | None = None
    topk: Int(1, MAX_MODEL_LEN) = DEFAULT_TOPK  # reports written before it have none

    @model_validator(mode="after")
    def _rows_exist(self) -> "ComparisonModel":
        for name in ("mask_rows", "nan_rows", "unwritten_rows", "value_rows"):
            rows = getattr(self, name)
            if rows and max(rows) >= self.rows:
                index = next(i for i, row in enumerate(rows) if row >= self.rows)
                raise SpecError(f"{name}[{index}]", rows[index], f"a row index in [0, rows = {self.rows})")
        return self


class StabilityModel(Model):
    """difftest.engine.stability.Stability."""

    what: ClassVar[str] = "a JSON object of Stability fields"
    kind: OneOf(STABILITY_KINDS)
    launches: Int(1, MAX_REPEAT)
    moved_rows: Rows
    unstable_rows: Rows
    max_abs_diff: NonNegative


class FindingModel(Model):
    """difftest.engine.sanitize.Finding."""

    what: ClassVar[str] = "a JSON object of Finding fields"
    message: Text()
    kernel: Text() | None
    count: Int(1, (1 << 63) - 1)
    details: ListOf(Text(), 1024, "a list of at most 1024 strings")


class SanitizerModel(Model):
    """difftest.engine.sanitize.SanitizerReport."""

    what: ClassVar[str] = "a JSON object of SanitizerReport fields"
    tool: OneOf(SanitizerTool)
    ran: Bool
    reason: Text() | None = None
    command: Text(MAX_COMMAND) | None = None
    exit_code: Int(-(1 << 31), (1 << 31) - 1) | None = None
    errors: Count | None = None
    findings: ListOf(FindingModel, MAX_ITEMS, "a list of sanitizer findings") = []
    output_tail: Text() = ""


class ReachModel(Model):
    """difftest.engine.result.Reach."""

    what: ClassVar[str] = "a JSON object of Reach fields"
    families: Names
    longest: Int(0, MAX_MODEL_LEN)
    pool_bytes: Int(0, MAX_POOL_BYTES)
    batch: Int(0, 2 * MAX_BATCH)


class SiblingsModel(Model):
    """difftest.core.contract.Siblings."""

    what: ClassVar[str] = "a JSON object {group, slowdown}"
    group: Filled("a non-empty group name")
    slowdown: Number(1, math.inf)


class TimingModel(Model):
    """difftest.engine.timing.Timing."""

    what: ClassVar[str] = "a JSON object of Timing fields"
    method: OneOf(TimingMethod)
    region: OneOf(TimedRegion)
    launches: Int(1, MAX_TIME)
    median: NonNegative  # 'nan' when `error`
    minimum: NonNegative
    maximum: NonNegative
    l2_flush: Bool
    siblings: SiblingsModel | None = None
    error: Text() | None = None


class CallMemoryModel(Model):
    """difftest.engine.result.CallMemory."""

    what: ClassVar[str] = "a JSON object {counted, measured, alone, retried, ran_out}"
    counted: Count | None = None
    measured: Count | None = None
    alone: Bool = False
    retried: Text() | None = None
    ran_out: Bool = False


class SelectionModel(Model):
    """difftest.engine.result.Selection: a top-k stage's selected set against the oracle's."""

    what: ClassVar[str] = "a JSON object of Selection fields"
    rows: Int(0, MAX_ROWS)
    wrong_rows: Rows
    wrong_tokens: Count
    symptoms: TableOf(OneOf(Verdict), Rows, "a table of verdict -> rows")
    first: Text() | None = None


class ViolationModel(Model):
    """difftest.engine.result.Violation: a metamorphic relation that does not hold."""

    what: ClassVar[str] = "a JSON object of Violation fields"
    relation: OneOf(MetamorphicRelation)
    related: ListOf(Name, 16, "a list of related case names")
    rows: ListOf(Int(0, MAX_ROWS), MAX_ROWS, "a list of row indices")
    row: Int(0, MAX_ROWS)
    position: Int(0, MAX_MODEL_LEN)
    original: JsonFloat
    related_value: JsonFloat
    expected: JsonFloat
    exact: Bool
    note: Text() = ""


class ResultModel(Model):
    """difftest.engine.result.CaseResult as serialize.to_jsonable writes it."""

    what: ClassVar[str] = "a JSON object of CaseResult fields"
    backend: Name
    case: Name
    description: Text()
    rows: Int(0, MAX_ROWS)
    verdict: Verdicts
    device: Devices
    encoding: OneOf(LengthEncoding) | None  # None: an operation other than paged logits
    layout: OneOf(CacheLayout) | None
    overridden: Bool
    seconds: Number(0.0, math.inf)
    comparison: ComparisonModel | None = None
    reason: Text() | None = None
    error_type: Name | None = None
    spec: SpecModel | None = None
    mutated_inputs: ListOf(Name, 64, "a list of at most 64 input names") = []
    stability: StabilityModel | None = None
    isolation: OneOf(Isolation) | None = None
    isolation_note: Text() | None = None
    sanitizer: SanitizerModel | None = None
    gpu: Text(MAX_NAME) | None = None
    reach: ReachModel | None = None
    timing: TimingModel | None = None
    library: Text() = ""  # reports written before it have none
    traceback: Text(MAX_TRACEBACK) | None = None
    memory: CallMemoryModel | None = None  # reports written before it have none
    operation: OneOf(OperationKind) = OperationKind.PAGED_LOGITS.value  # reports written before it: paged logits
    selection: SelectionModel | None = None
    headline: Text() | None = None

    metamorphic: ListOf(ViolationModel, 64, "a list of violated relations") = []

    @model_validator(mode="before")
    @classmethod
    def _spec_of_its_operation(cls, data: Any) -> Any:
        """A paged-logits result's spec is a CaseSpec (SpecModel); another operation's is its own spec's JSON,
        checked here as a JSON object only (its operation's from_json reads it)."""
        if isinstance(data, dict) and data.get("operation", OperationKind.PAGED_LOGITS.value) != \
                OperationKind.PAGED_LOGITS.value and data.get("spec") is not None:
            if not (type(data["spec"]) is dict and len(data["spec"]) <= 64):
                raise SpecError("spec", shown(data["spec"]), "a JSON object of at most 64 spec fields")
            data = {key: value for key, value in data.items() if key != "spec"}
        return data


class OmittedModel(Model):
    what: ClassVar[str] = "a JSON object {family, reason}"
    family: Name
    reason: Text()


class PlanInfoModel(Model):
    """The `plan` of an envelope run's info (difftest.workflows.session)."""

    what: ClassVar[str] = "a JSON object {omitted, idle, cases}"
    omitted: TableOf(Name, ListOf(OmittedModel, MAX_ITEMS, "a list of {family, reason}"),
                     "a table of backend -> [{family, reason}]") = {}
    idle: TableOf(Name, Text(), "a table of backend -> why it ran nothing") = {}
    cases: Count = 0


class ShardInfoModel(Model):
    """One entry of a spread run's `shards` (difftest.workflows.spread.ShardRun.info)."""

    what: ClassVar[str] = "a JSON object of a shard's fields"
    shard: Text(64)
    env: TableOf(Text(MAX_NAME), Text(), "a table of environment variables")
    exit: Text()
    died: Bool
    results: Count
    expected: Count
    log: Text()


class MatrixRunModel(Model):
    """The `matrix` of a report `difftest matrix run` wrote: which cell of the matrix it is
    (difftest.matrix.cell)."""

    what: ClassVar[str] = "a JSON object {cell, device, version, library, suite}"
    cell: Name
    device: OneOf(DeviceKind)
    version: Name
    library: Text(MAX_NAME)
    suite: Name


class VariantsModel(Model):
    """The variants of one fuzz signature (difftest.workflows.signatures.Variants.to_json), each with its count."""

    what: ClassVar[str] = "a JSON object {draft_rows, kinds, shapes}"
    draft_rows: TableOf(Name, Count, "a table of draft row -> results") = {}
    kinds: TableOf(Name, Count, "a table of kinds of wrong rows -> results") = {}
    shapes: TableOf(Name, Count, "a table of case shape -> results") = {}


class AlsoModel(Model):
    """Another signature whose cases shrank to a fuzz signature's shrunk case, with its count."""

    what: ClassVar[str] = "a JSON object {backend, verdict, pattern, error, results}"
    backend: Name
    verdict: Verdicts
    pattern: Name | None = None
    error: Name | None = None
    results: Count


class SignatureInfoModel(Model):
    """One signature of a fuzz campaign's report (difftest.workflows.fuzz.campaign_info)."""

    what: ClassVar[str] = "a JSON object of signature fields"
    backend: Name
    verdict: Verdicts
    pattern: Name | None = None  # difftest.engine.explain.Pattern's value (the explainer may add patterns)
    error: Name | None = None
    results: Count
    first: Name
    description: Text() = ""
    also: ListOf(AlsoModel, MAX_ITEMS, "a list of signatures") = []
    variants: VariantsModel = VariantsModel()
    bundle: Text() | None = None
    shrunk: Text() | None = None
    shrunk_bundle: Text() | None = None
    unshrunk: Text() | None = None
    repro: Text(MAX_COMMAND) | None = None
    replay: Text(MAX_COMMAND) | None = None


class PhasesModel(Model):
    """Where a fuzz campaign's time went (difftest.workflows.fuzz.Phases)."""

    what: ClassVar[str] = "a JSON object {cases, shrinking, total}"
    cases: Number()
    shrinking: Number()
    total: Number()


class CampaignInfoModel(Model):
    """The `campaign` of a fuzz campaign's run info (difftest.workflows.fuzz.campaign_info)."""

    what: ClassVar[str] = "a JSON object of campaign fields"
    shrink_seconds: Number()
    jobs: Int(1, 1 << 16) = 1
    phases: PhasesModel
    bundles: Text() | None = None
    signatures: ListOf(SignatureInfoModel, MAX_ITEMS, "a list of signatures") = []


class RunInfoModel(Model):
    """How a run was made: the `run` of a report and of a stream's {"run": ...} lines, as difftest.workflows.session
    and the pytest plugin write it. Every field is optional (a report may carry an empty one)."""

    what: ClassVar[str] = "a JSON object of run fields"
    command: Text(MAX_COMMAND) | None = None
    seed: Seed | None = None
    cases: Rule(lambda v: (_is_int(v) and 0 <= v < 1 << 63) or (type(v) is str and len(v) <= MAX_NAME),
                "a number of cases, or the suite's name").type() | None = None
    device: Devices | None = None
    backends: Names | None = None
    gpu: Text(MAX_NAME) | None = None
    torch: Text(MAX_NAME) | None = None
    difftest: Text(MAX_NAME) | None = None
    python: Text(MAX_NAME) | None = None
    started: Text(64) | None = None
    seconds: Number(0.0, math.inf) | None = None
    encoding_override: OneOf(LengthEncoding) | None = None
    layout_override: OneOf(CacheLayout) | None = None
    isolated: Bool | None = None
    timeout: Number(0.0, math.inf) | None = None
    repeat: Int(1, MAX_REPEAT) | None = None
    sanitize: OneOf(SanitizerTool) | None = None
    sanitize_all: Bool | None = None
    oracle: OneOf(OracleKind) | None = None
    cases_kind: OneOf(CaseKind) | None = None
    budget: Number(0.0, math.inf) | None = None
    operation: OneOf(OperationKind) | None = None  # runs of paged logits (and those before operations) have none
    case_filter: ListOf(Text(MAX_NAME), MAX_ITEMS, "a list of fnmatch patterns") | None = None
    shard: Text(64) | None = None
    resumed_from: Text(MAX_TEXT) | None = None
    resumed: Count | None = None
    not_started: Names | None = None
    plan: PlanInfoModel | None = None
    shards: ListOf(ShardInfoModel, 4096, "a list of shard records") | None = None
    incomplete: Bool | None = None  # the run was interrupted: the report holds what finished
    startup_timeout: Number(0.0, math.inf) | None = None
    time: Int(1, MAX_TIME) | None = None  # timed launches per case
    fail_slow: Bool | None = None  # a sibling slower than allowed fails the run
    matrix: MatrixRunModel | None = None  # the matrix cell the run was (difftest matrix run)
    campaign: CampaignInfoModel | None = None  # what a fuzz campaign found (difftest fuzz --report)


class SummaryModel(Model):
    """difftest.records.report.BackendSummary."""

    what: ClassVar[str] = "a JSON object of BackendSummary fields"
    backend: Name
    cases: Count
    skipped: Count
    rows: Count
    mask_rows: Count
    max_rel_err: NonNegative
    topk_overlap: JsonFloat | None  # null: n/a (no row longer than the top-k); 'nan' in older reports: none compared
    verdict: Verdicts
    counts: TableOf(Verdicts, Count, "a table of verdict -> cases")
    skip_reasons: ListOf(Text(), MAX_ITEMS, "a list of skip reasons")
    stability: Text(MAX_NAME) | None = None
    # Reports written before the time column have none of these.
    seconds: Number(0.0, math.inf) = 0.0
    median_seconds: Number(0.0, math.inf) = 0.0
    kernel_seconds: Number(0.0, math.inf) | None = None
    timed_region: OneOf(TimedRegion) | None = None
    library: Text() = ""  # reports written before it have none
    # Reports written before operations have none of these (paged logits).
    operation: OneOf(OperationKind) = OperationKind.PAGED_LOGITS.value
    selected_rows: Count = 0
    set_rows: Count = 0
    wrong_tokens: Count = 0


class SiblingTimeModel(Model):
    """difftest.engine.performance.SiblingTime."""

    what: ClassVar[str] = "a JSON object of SiblingTime fields"
    backend: Name
    seconds: Number(0.0, math.inf)
    ratio: Number(1, math.inf)
    allowed: Number(1, math.inf)
    region: OneOf(TimedRegion)
    slow: Bool


class SiblingRaceModel(Model):
    """difftest.engine.performance.SiblingRace: one case, one sibling group."""

    what: ClassVar[str] = "a JSON object {case, group, times}"
    case: Name
    group: Filled("a non-empty group name")
    times: ListOf(SiblingTimeModel, MAX_ITEMS, "a list of sibling times, fastest first", low=2)


class MutantScoreModel(Model):
    """One mutant's row of a selftest's score (difftest.workflows.selftest.MutantScore)."""

    what: ClassVar[str] = "a JSON object of MutantScore fields"
    mutant: Name
    bug_class: Name
    expected: Name
    production_only: Bool
    status: OneOf(SELFTEST_STATUSES)
    expected_here: Bool
    ok: Bool
    caught_by: ListOf(Name, MAX_ITEMS, "a list of edge families") = []
    first_case: Name | None = None
    first_verdict: Verdicts | None = None
    seconds: Number(0.0, math.inf) | None = None
    cases: Count = 0
    why: Text() = ""


class SelftestModel(Model):
    """The `selftest` section of a selftest's report (difftest.workflows.selftest.score_section)."""

    what: ClassVar[str] = "a JSON object {summary, status, template, envelope, seconds, fuzz_seconds, mutants}"
    summary: Text()
    status: OneOf(("OK", "FAILED"))
    template: Name | None = None
    envelope: Text() = ""
    seconds: Number(0.0, math.inf)
    fuzz_seconds: Number(0.0, math.inf) | None = None
    mutants: ListOf(MutantScoreModel, MAX_ITEMS, "a list of mutant scores")


class ReportModel(Model):
    """A JSON report (difftest.records.report.write_json)."""

    what: ClassVar[str] = "a JSON report {run, summaries, results}"
    run: RunInfoModel = RunInfoModel()
    summaries: ListOf(SummaryModel, MAX_ITEMS, "a list of backend summaries") = []
    results: ListOf(ResultModel, 1 << 30, "a list of results")
    performance: ListOf(SiblingRaceModel, 1 << 30, "a list of sibling races (--time)") = []
    selftest: SelftestModel | None = None  # `difftest selftest`'s score


class StreamLineModel(Model):
    """One line of a JSONL stream (serialize.ResultStream): {"run": ...} or {"result": ...}."""

    what: ClassVar[str] = STREAM_TEXT
    unknown_expected: ClassVar[str | None] = STREAM_TEXT
    run: RunInfoModel | None = None
    result: ResultModel | None = None

    @model_validator(mode="after")
    def _one(self) -> "StreamLineModel":
        if (self.run is None) == (self.result is None):
            raise SpecError("", sorted(self.model_fields_set), STREAM_TEXT)
        return self


class OriginModel(Model):
    """difftest.backends.Origin: how a fresh process rebuilds the backend."""

    what: ClassVar[str] = "a JSON object {target, registered, why_not}"
    target: Name | None
    registered: Bool
    why_not: Text() = ""

    @model_validator(mode="after")
    def _registered_is_a_name(self) -> "OriginModel":
        # A registered origin is a name the registry resolves; a 'module:object' path never is one (replay
        # imports a path only when the bundle is trusted, difftest.workflows.replay).
        if self.registered and (self.target is None or ":" in self.target):
            raise SpecError("registered", True, f"false for the target {self.target!r}: only a registered "
                            "backend name (no ':') is registered")
        return self


class BundleInfoModel(Model):
    """bundle.json (difftest.records.bundle.write_bundle)."""

    what: ClassVar[str] = "a JSON object of bundle fields"
    backend: Name
    origin: OriginModel
    library: Text(MAX_NAME) = ""
    device: Devices
    encoding_override: OneOf(LengthEncoding) | None = None
    layout_override: OneOf(CacheLayout) | None = None
    isolate: Bool | None = None  # RunConfig.isolate of the run that wrote it: where replay and shrink run it
    timeout: Number(0.0, math.inf) | None = None
    # The rest of its run's RunConfig (bundles written before these fields existed replay with the defaults);
    # startup_timeout at most engine.config.MAX_STARTUP_TIMEOUT (restated, as MAX_REPEAT is).
    startup_timeout: Number(0.0, 86400.0) | None = None
    oracle: OneOf(OracleKind) | None = None
    repeat: Int(1, MAX_REPEAT) = 1
    metamorphic: ListOf(OneOf(MetamorphicRelation), 64, "a list of metamorphic relations") = []
    verdict: Verdicts
    reason: Text() | None = None
    comparison: ComparisonModel | None = None
    case: Name
    description: Text() = ""
    torch: Text(MAX_NAME) = ""
    difftest: Text(MAX_NAME) = ""
    python: Text(MAX_NAME) = ""
    gpu: Text(MAX_NAME) | None = None
    replay: Text(MAX_COMMAND) = ""
    operation: OneOf(OperationKind) = OperationKind.PAGED_LOGITS.value  # bundles written before it: paged logits
    headline: Text() | None = None
    selection: SelectionModel | None = None


class CaseMetaModel(Model):
    """The `meta` of a case archive (difftest.core.case.Case.save): the structure its arrays must have, and
    what Case.meta held (seed and spec of a drawn case, its edge families, a golden file's note)."""

    what: ClassVar[str] = "a JSON object of case meta fields"
    name: Text(MAX_NAME)
    B: Int(0, 2 * MAX_BATCH)
    next_n: Int(1, MAX_NEXT_N)
    H: Int(1, MAX_HEADS)
    D: HeadDim
    block_size: Int(1, MAX_BLOCK_SIZE)
    max_model_len: Int(1, MAX_MODEL_LEN)
    layout: OneOf(CacheLayout)
    fp8: OneOf(Fp8Flavour)
    seq_lens: IntList(0, MAX_MODEL_LEN, 2 * MAX_BATCH, "a list of B lengths in [0, max_model_len]")
    seed: Seed | None = None
    spec: SpecModel | None = None
    families: Names | None = None
    reach: TableOf(Name, Names, "a JSON object of backend names and the families each one reaches") | None = None
    note: Text() | None = None
    topk_k: Int(1, MAX_MODEL_LEN) | None = None  # an indexer case's top-k k (difftest.core.indexer)

    @model_validator(mode="after")
    def _consistent(self) -> "CaseMetaModel":
        if len(self.seq_lens) != self.B:
            raise SpecError("seq_lens", shown(self.seq_lens), f"B = {self.B} lengths")
        _within("seq_lens", self.seq_lens, self.max_model_len)
        rows = self.B * self.next_n
        if rows * self.max_model_len > MAX_LOGITS:
            raise SpecError("B", self.B, f"B * next_n * max_model_len at most {_n(MAX_LOGITS)}")
        if rows * self.H * self.D > MAX_QUERY_BYTES:
            raise SpecError("B", self.B, f"B * next_n * H * D at most {_n(MAX_QUERY_BYTES)}")
        if self.spec is not None:
            self._matches_spec(self.spec)
        return self

    def _matches_spec(self, spec: SpecModel) -> None:
        """The arrays were drawn from `spec`: their structure is the spec's."""
        pairs = (("next_n", "next_n"), ("H", "heads"), ("D", "head_dim"), ("block_size", "block_size"),
                 ("max_model_len", "max_model_len"), ("fp8", "fp8"))
        for mine, theirs in pairs:
            if getattr(self, mine) != getattr(spec, theirs):
                raise SpecError(mine, getattr(self, mine), f"spec.{theirs} = {getattr(spec, theirs)!r}, "
                                "the spec the case was drawn from")
        requests = (len(spec.lengths) if spec.lengths is not None else spec.batch) + spec.padding
        if self.B != requests:
            raise SpecError("B", self.B, f"{requests}: the spec's requests and padding")
        if spec.lengths is not None and tuple(self.seq_lens[:len(spec.lengths)]) != tuple(spec.lengths):
            raise SpecError("seq_lens", shown(self.seq_lens), "the spec's lengths, then its padding")


# --------------------------------------------------------------------------- the ledger

RANGE_TEXT = "a range { min = A, max = B } (either may be left out)"
FAILING_VERDICTS = [v.value for v in Verdict if v.failed]


def _is_range(value: Any, bound: Callable[[Any], bool]) -> bool:
    """A range table { min = A, max = B }: one or both bounds, integers that pass `bound`, A <= B."""
    if type(value) is not dict or not value or not set(value) <= {"min", "max"}:
        return False
    ordered = "min" not in value or "max" not in value or value["min"] <= value["max"]
    return ordered and all(_is_int(v) and bound(v) for v in value.values())


def _pattern_or(field: Any) -> Any:
    """A ledger spec value: an fnmatch pattern (a string), a value the CaseSpec field may take, or, for
    an integer field and for lengths, a range of them."""
    annotation, _ = _strip(field.annotation)
    inner = next((m for m in (*field.metadata, *getattr(annotation, "__metadata__", ())) if isinstance(m, Rule)), None)
    if inner is None:  # lengths: a list of lengths, or a range one of the case's lengths must fall in
        def length(n: Any) -> bool:
            return _is_int(n) and 0 <= n <= MAX_MODEL_LEN

        def check(value: Any) -> bool:
            return (type(value) is str and len(value) <= MAX_NAME) or _is_range(value, length) or (
                type(value) is list and len(value) <= MAX_BATCH and all(length(n) for n in value))

        return Rule(check, f"an fnmatch pattern (a string), a list of lengths, or {RANGE_TEXT}").type()
    if _base(annotation) is int:
        return Rule(lambda v: (type(v) is str and len(v) <= MAX_NAME) or inner.check(v) or _is_range(v, inner.check),
                    f"an fnmatch pattern (a string), {inner.expected}, or {RANGE_TEXT} of those").type()
    return Rule(lambda v: (type(v) is str and len(v) <= MAX_NAME) or inner.check(v),
                f"an fnmatch pattern (a string), or {inner.expected}").type()


def _verdicts(value: Any) -> bool:
    values = value if type(value) is list else [value]
    return 0 < len(values) <= len(FAILING_VERDICTS) and all(type(v) is str and v in FAILING_VERDICTS for v in values)


class _LedgerSpecBase(Model):
    what: ClassVar[str] = "a table of CaseSpec fields, e.g. { next_n = 2 }"
    unknown_expected: ClassVar[str | None] = f"CaseSpec fields among {sorted(SPEC_DEFAULTS)}"


# Each CaseSpec field, as a ledger entry may give it: an fnmatch pattern or a value of the field.
LedgerSpecModel: type[_LedgerSpecBase] = create_model(  # type: ignore[call-overload]
    "LedgerSpecModel", __base__=_LedgerSpecBase,
    **{name: (_pattern_or(field), None) for name, field in SpecModel.model_fields.items()})


class DivergenceModel(Model):
    """One [[divergence]] table of a ledger (difftest.records.ledger)."""

    what: ClassVar[str] = "a [[divergence]] table"
    unknown_name: ClassVar[str | None] = "keys"
    unknown_expected: ClassVar[str | None] = ("keys among ['backend', 'case', 'verdict', 'spec', 'strict', 'reason', "
                                              "'issue']")
    backend: Filled("a backend name or fnmatch pattern")
    case: Filled("a case name or fnmatch pattern") = "*"
    verdict: Rule(_verdicts, f"a failing verdict, or a list of them, among {FAILING_VERDICTS}").type() = None
    spec: LedgerSpecModel = Field(default_factory=LedgerSpecModel)  # type: ignore[valid-type]
    strict: Bool = False
    reason: Filled("a non-empty string", MAX_TEXT)
    issue: Rule(lambda v: type(v) is str and len(v) <= MAX_NAME and ISSUE.fullmatch(v.strip()) is not None,
                ISSUE_TEXT).type(str)




class LedgerModel(Model):
    """A ledger file: [[divergence]] tables and nothing else."""

    what: ClassVar[str] = "a TOML document of [[divergence]] tables"
    unknown_name: ClassVar[str | None] = "tables"
    unknown_expected: ClassVar[str | None] = "only [[divergence]] tables"
    divergence: ListOf(DivergenceModel, 1 << 16, "an array of tables ([[divergence]])") = []


# --------------------------------------------------------------------------- the CI matrix file

MAX_MATRIX_ITEMS = 256  # entries of one axis or rule list: a matrix past this is not one CI can run
MAX_SUITE_SECONDS = 7 * 86400  # a suite's budget; a week is far past any CI job's limit
MATRIX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MATRIX_NAME_TEXT = "a name of 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
# A pinned wheel: 'distribution==version' (PEP 508 name, PEP 440 version characters), extras allowed.
PINNED = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(\[[A-Za-z0-9._,-]*\])?==([A-Za-z0-9.+!_-]+)")

# difftest itself, as a CI job installs it ([matrix.difftest]): a release's version (PEP 440, public), a git
# URL pip can clone and a ref in it, or a wheel file. Each goes into a shell command (quoted) and a pip
# requirement, so none may hold what pip would read as another part of it ('@', '#', ';', a space).
RELEASE = re.compile(r"[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?")
GIT_URL = re.compile(r"(git\+)?(https?|ssh|file)://[^\s@#;]+(@[^\s@#;/]+/[^\s@#;]+)?|git@[^\s@#;]+:[^\s@#;]+")
GIT_REF = re.compile(r"[A-Za-z0-9._/-]{1,255}")
MatrixName = Rule(lambda v: type(v) is str and MATRIX_NAME.fullmatch(v) is not None, MATRIX_NAME_TEXT).type(str)
Pattern = Filled("an fnmatch pattern (a non-empty string)")
Patterns = ListOf(Pattern, MAX_MATRIX_ITEMS, f"a list of 1 to {MAX_MATRIX_ITEMS} fnmatch patterns", low=1)
Labels = Rule(lambda v: (type(v) is str and v.strip() != "" and len(v) <= MAX_NAME) or (
    type(v) is list and 1 <= len(v) <= 16 and all(type(x) is str and x.strip() != "" for x in v)),
    "a runner label, or a list of 1 to 16 labels").type()


class MatrixDeviceModel(Model):
    """One [matrix.devices.KIND] table: where the CI jobs of that device kind run."""

    what: ClassVar[str] = "a table {runner, queue}"
    runner: Labels  # GitHub Actions `runs-on`
    queue: Filled("a Buildkite agent queue (a non-empty string)") | None = None  # default: the runner label


class MatrixVersionModel(Model):
    """One [matrix.versions.NAME] table: a library version the backends it provides run under."""

    what: ClassVar[str] = "a table {wheel or path, backends, pip_args}"
    wheel: Rule(lambda v: type(v) is str and PINNED.fullmatch(v) is not None,
                "a pinned requirement 'distribution==version'").type(str) | None = None
    path: Filled("a folder (a source checkout or an unpacked tree)") | None = None
    backends: Patterns = ["*"]  # pydantic copies a mutable default
    pip_args: ListOf(Text(256), 16, "a list of at most 16 pip options, e.g. ['--no-deps']") = []

    @model_validator(mode="after")
    def _one_source(self) -> "MatrixVersionModel":
        if self.wheel is not None and self.path is not None:
            raise SpecError("path", self.path, "no path beside a wheel: a version is one wheel or one folder")
        if self.pip_args and self.wheel is None:
            raise SpecError("pip_args", self.pip_args, "no pip options without a wheel to install")
        return self


class MatrixDifftestModel(Model):
    """[matrix.difftest]: how every CI job installs difftest itself (with its matrix extra). At most one
    of version, git or wheel; none of them: the version of difftest that emits the CI files."""

    what: ClassVar[str] = "a table {version}, {git, ref} or {wheel}"
    version: Rule(lambda v: type(v) is str and RELEASE.fullmatch(v) is not None,
                  "a difftest release, e.g. '0.1.0'").type(str) | None = None
    git: Rule(lambda v: type(v) is str and len(v) <= MAX_NAME and GIT_URL.fullmatch(v) is not None,
              "a git URL pip can clone, e.g. 'https://github.com/ORG/difftest'").type(str) | None = None
    ref: Rule(lambda v: type(v) is str and GIT_REF.fullmatch(v) is not None and not v.startswith("-"),
              "a branch, tag or commit of the git URL").type(str) | None = None
    wheel: Rule(lambda v: type(v) is str and v.endswith(".whl") and v.strip() == v and len(v) <= MAX_NAME,
                "a wheel file (.whl), relative to the matrix file").type(str) | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "MatrixDifftestModel":
        given = [name for name in ("version", "git", "wheel") if getattr(self, name) is not None]
        if len(given) > 1:
            raise SpecError(given[1], getattr(self, given[1]), f"nothing beside {given[0]}: difftest is installed "
                            "from a version, a git URL or a wheel, one of them")
        if self.ref is not None and self.git is None:
            raise SpecError("ref", self.ref, "a ref only beside a git URL")
        return self


class MatrixSuiteModel(Model):
    """One [matrix.suites.NAME] table: which cases a cell runs (as `difftest run` or `fuzz` options)."""

    what: ClassVar[str] = "a table of suite fields"
    cases: OneOf(CaseKind) = CaseKind.ENVELOPE.value
    count: Int(1, 1000) | None = None
    seed: Seed = 0
    budget: Number(1.0, MAX_SUITE_SECONDS) | None = None  # seconds
    spec: SpecModel | None = None
    case_filter: ListOf(Pattern, MAX_MATRIX_ITEMS, "a list of fnmatch patterns") = []
    fuzz: Bool = False  # a `difftest fuzz` campaign of `budget` seconds instead of a run
    isolate: Bool | None = None
    selftest: Bool = False  # also `difftest selftest` in the envelope of the cell's first backend: its score
    op: OneOf(OperationKind) = OperationKind.PAGED_LOGITS.value  # the operation whose backends it runs

    @model_validator(mode="after")
    def _fuzz_budget(self) -> "MatrixSuiteModel":
        if self.fuzz and self.budget is None:
            raise SpecError("budget", None, "a number of seconds: a fuzz suite runs for its budget")
        return self


class MatrixIncludeModel(Model):
    """One [[matrix.include]] table: combinations run even where an exclude rule matches them."""

    what: ClassVar[str] = "a table of fnmatch patterns {device, backend, version, suite}"
    device: Pattern = "*"
    backend: Pattern = "*"
    version: Pattern = "*"
    suite: Pattern = "*"


class MatrixExcludeModel(MatrixIncludeModel):
    """One [[matrix.exclude]] table: combinations not run, and why."""

    what: ClassVar[str] = "a table {device, backend, version, suite, reason}"
    reason: Filled("a non-empty string: why these combinations are not run", MAX_TEXT)


class MatrixModel(Model):
    """The CI matrix: [matrix] of a difftest.toml, or [tool.difftest.matrix] of a pyproject.toml."""

    what: ClassVar[str] = "a [matrix] table"
    devices: Annotated[dict[OneOf(DeviceKind), MatrixDeviceModel], Field(min_length=1),
                       Expect(f"a table of device kind -> {{runner}}, kinds among {[k.value for k in DeviceKind]}")]
    backends: ListOf(Filled("a registered backend name or 'package.module:object'"), MAX_MATRIX_ITEMS,
                     f"a list of 1 to {MAX_MATRIX_ITEMS} backend names", low=1)
    versions: Annotated[dict[MatrixName, MatrixVersionModel], Field(min_length=1, max_length=MAX_MATRIX_ITEMS),
                        Expect("a table of version name -> {wheel or path, backends}")] = Field(
        default_factory=lambda: {"installed": MatrixVersionModel()})  # the job's own environment
    suites: Annotated[dict[MatrixName, MatrixSuiteModel], Field(min_length=1, max_length=MAX_MATRIX_ITEMS),
                      Expect("a table of suite name -> suite fields")]
    include: ListOf(MatrixIncludeModel, MAX_MATRIX_ITEMS, "an array of tables ([[matrix.include]])") = []
    exclude: ListOf(MatrixExcludeModel, MAX_MATRIX_ITEMS, "an array of tables ([[matrix.exclude]])") = []
    ledger: Filled("a ledger file (TOML)") | None = None
    baseline: Filled("a merged.json of an earlier merge") | None = None
    difftest: MatrixDifftestModel = Field(default_factory=MatrixDifftestModel)  # how CI installs difftest
    setup: ListOf(Text(MAX_NAME, 1), 16, "a list of at most 16 shell commands") = []  # run after installing difftest
    merge_runner: Labels = "ubuntu-latest"  # where the merge job runs


class MergedEntryModel(Model):
    """One result of a merged matrix report (difftest.matrix.merge.Entry)."""

    what: ClassVar[str] = "a JSON object of merged result fields"
    cell: Name
    device: OneOf(DeviceKind)
    version: Name
    library: Text(MAX_NAME)
    backend: Name
    case: Name
    families: Names
    verdict: Verdicts
    rows: Count
    mask_rows: Count
    nan_rows: Count
    value_rows: Count
    known: Text() | None = None  # the ledger's "reason (issue)" of a known divergence
    loaded: Text() = ""  # the backend's Contract.library; merges written before it have none


class MergedModel(Model):
    """merged.json (`difftest matrix merge`): what a later merge diffs against as its baseline."""

    what: ClassVar[str] = "a JSON object {difftest, cells, results}"
    difftest: Text(MAX_NAME)
    cells: Names
    results: ListOf(MergedEntryModel, 1 << 30, "a list of merged results")


# --------------------------------------------------------------------------- [tool.difftest] defaults

# What a `difftest run` option's value may be in a pyproject.toml's [tool.difftest] table, by the
# kind of option (difftest.cli maps each of its options to one of these).
OPTION_FLAG = Bool
OPTION_INT = Rule(_is_int, "an integer").type(int)
OPTION_NUMBER = Rule(lambda v: type(v) in (int, float) and math.isfinite(v), "a number").type()
OPTION_TEXT = Text(MAX_TEXT)
OPTION_TEXTS = ListOf(Text(MAX_TEXT), MAX_ITEMS, "a list of strings")
OPTION_NAMES = ListOf(Filled("a non-empty name"), MAX_ITEMS, "a list of names, e.g. [\"torch\", \"mymod:kernel\"]")
OPTION_INTS = IntList(-(1 << 63), (1 << 63) - 1, MAX_ITEMS, "a list of integers, e.g. [1, 2, 4]")
PROJECT_TABLES = ("matrix",)  # [tool.difftest.<name>] tables that other commands read


def validate_defaults(data: Any, options: dict[str, Any], where: str) -> dict[str, Any]:
    """The [tool.difftest] table `data` of a pyproject.toml: each key one of `options` (an option's
    name without its dashes -> what its value may be), the tables of PROJECT_TABLES left to their
    readers; the keys given, with their values. SpecError naming `where` and the key otherwise."""
    if not isinstance(data, dict):
        raise SpecError(where.rstrip(), shown(data), "a table of `difftest run` options")
    base = type("ProjectDefaultsBase", (Model,), {
        "__module__": __name__, "what": "a table of `difftest run` options", "unknown_name": f"{where}keys",
        "unknown_expected": f"`difftest run` options among {sorted(options)} (or the tables {list(PROJECT_TABLES)})"})
    # Not Optional: TOML has no null. The None default is never validated, and model_dump leaves it out.
    fields = {key.replace("-", "_"): (kind, Field(None, alias=key)) for key, kind in options.items()}
    model = create_model("ProjectDefaultsModel", __base__=base, **fields)  # type: ignore[call-overload]
    given = {key: value for key, value in data.items() if key not in PROJECT_TABLES}
    return validate(model, given, where).model_dump(by_alias=True, exclude_unset=True)


# --------------------------------------------------------------------------- validation -> SpecError

M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: Any, where: str = "", root: str = "") -> M:
    """`data` as `model`; SpecError naming the first field that does not fit.

    Paths follow `where` ('.../bundle.json ' reads '.../bundle.json origin.target'; 'result.' reads
    'result.verdict'); an error about the document as a whole is named `where` without its separator,
    else `root`.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise spec_error(exc, model, where, root) from None
    except RecursionError:
        raise SpecError(where.rstrip(". ") or root or model.__name__, "...", "a document nested less deeply") from None


def spec_error(exc: ValidationError, model: type[BaseModel], where: str = "", root: str = "") -> SpecError:
    """The one-line SpecError of the first error of `exc` (unknown fields first, all of one object's together)."""
    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    loc = tuple(first["loc"])

    def name(path: str) -> str:
        return one_line(where + path if path else where.rstrip(". ") or root or model.__name__)

    if first["type"] == "extra_forbidden":
        parent = loc[:-1]
        keys = sorted(str(e["loc"][-1]) for e in unknown if tuple(e["loc"][:-1]) == parent)
        path, owner, _ = _walk(model, parent)
        holder = owner if isinstance(owner, type) and issubclass(owner, Model) else Model
        field = name(path)
        if holder.unknown_name:
            field = one_line(f"{where}{path} {holder.unknown_name}" if path else holder.unknown_name)
        fields = [f.alias or n for n, f in holder.model_fields.items()] if holder is not Model else []
        return SpecError(field, shown(keys), holder.unknown_expected or f"fields among {sorted(fields)}")
    ctx = first.get("ctx") or {}
    if first["type"] == "value_error" and isinstance(ctx.get("error"), SpecError):
        inner: SpecError = ctx["error"]
        path, _, _ = _walk(model, loc)
        joined = path + inner.field if inner.field.startswith("[") else ".".join(p for p in (path, inner.field) if p)
        return SpecError(name(joined), shown(inner.value), inner.expected)
    path, annotation, optional = _walk(model, loc)
    expected = _expected_of(annotation) or ctx.get("expected") or _lower(first["msg"])
    if optional and first["type"] != "missing":
        expected += ", or null"
    value = None if first["type"] == "missing" else first.get("input")
    return SpecError(name(path), shown(value), expected)


def _walk(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[str, Any, bool]:
    """(the path of `loc` as text, the annotation found there, whether it may be null)."""
    path, annotation = "", model
    steps = list(loc)
    while steps:
        step = steps.pop(0)
        annotation, _ = _strip(annotation)
        base = _base(annotation)
        if isinstance(base, type) and issubclass(base, BaseModel) and isinstance(step, str):
            field = next((f for n, f in base.model_fields.items() if (f.alias or n) == step), None)
            path += f".{step}" if path else step
            if field is None:
                return path, None, False
            annotation = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
        elif typing.get_origin(base) is list and isinstance(step, int):
            path += f"[{step}]"
            annotation = typing.get_args(base)[0]
        elif typing.get_origin(base) is dict:
            key_type, value_type = typing.get_args(base)
            if steps and steps[0] == "[key]":
                steps.pop(0)
                return f"{path} key {step!r}", key_type, False
            path += f"[{step!r}]"
            annotation = value_type
        else:  # a union member's tag, or a step the annotation does not explain
            continue
    annotation, optional = _strip(annotation)
    return path, annotation, optional


def _expected_of(annotation: Any) -> str | None:
    for marker in getattr(annotation, "__metadata__", ()):
        if isinstance(marker, (Rule, Expect)):
            return marker.expected
    base = _base(annotation)
    if isinstance(base, type) and issubclass(base, Model):
        return base.what
    return None


def _lower(message: str) -> str:
    return message[:1].lower() + message[1:]


class Clipped:
    """A long value, shown by the start of its repr."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def shown(value: Any, limit: int = 200) -> Any:
    """`value`, or a Clipped of its repr when that is longer than `limit` (an error is one line)."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # nested past repr's depth; an int past str()'s digits
        return Clipped(f"<{type(value).__name__} too deep or too long to show>")
    if len(text) <= limit:
        return value
    return Clipped(f"{text[:limit]}... ({len(text)} characters)")


def one_line(text: str) -> str:
    """`text` with its control characters escaped (difftest.core.text.printable): an error stays one line."""
    return printable(text, lines=False)


# --------------------------------------------------------------------------- reading documents

def read_text(path: str | Path, field: str, what: str, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """The UTF-8 text of `path`; SpecError(field, path, ...) when it cannot be read, is not a regular
    file (a FIFO would block the read until a writer came, a device never end), is not UTF-8 or is
    larger than `limit` bytes."""
    chunks, size = [], 0
    try:
        # Opened without blocking (a FIFO's open waits for a writer), then checked to be a regular file.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise SpecError(field, str(path), f"a {what} in a regular file (not a FIFO, device or folder)")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as file:
            # In chunks: file.read(limit + 1) would set aside `limit` bytes before reading any.
            while size <= limit and (chunk := file.read(1 << 20)):
                chunks.append(chunk)
                size += len(chunk)
    except OSError as exc:
        raise SpecError(field, str(path), f"a readable {what} ({exc.strerror or exc})") from None
    if size > limit:
        raise SpecError(field, str(path), f"a {what} of at most {_n(limit)} bytes")
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(field, str(path), f"a {what} in UTF-8 (byte {exc.start} is not)") from None


def read_toml(path: str | Path, field: str, what: str) -> dict[str, Any]:
    """The TOML document at `path`; SpecError(field, path, ...) when it cannot be read or parsed.
    Python 3.10 reads TOML through the `tomli` package (3.11+ has tomllib)."""
    text = read_text(path, field, what)
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise SpecError(field, str(path), f"a {what}, which Python 3.10 reads with tomli (pip install tomli)") \
                from None
    try:
        return tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError, or an integer past str()'s digits
        raise SpecError(field, str(path), f"a {what} in valid TOML ({one_line(str(exc))})") from None


def parse_json(text: str) -> Any:
    """json.loads, ValueError (never RecursionError) for text that is not JSON, nests too deeply, or
    gives one key twice in an object (json.loads would keep the last silently)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The object of `pairs`; ValueError naming a key given twice."""
    made = dict(pairs)
    if len(made) != len(pairs):
        twice = next(key for key, times in Counter(key for key, _ in pairs).items() if times > 1)
        raise ValueError(f"the key {twice!r} is given twice")
    return made


# --------------------------------------------------------------------------- case archives (.npz)

# member -> (the dtypes it may have, what its shape must be, in words)
_MEMBERS = {
    "q": (("|u1",), "[B, next_n, H, D] uint8"),
    "kv_cache": (("|u1",), "[num_blocks, block_size, 1, D + 4] uint8"),
    "weights": (("<f4",), "[B * next_n, H] float32"),
    "context_lens": (("<i4", "<i8"), "[B, next_n] int32"),
    "block_table": (("<i4", "<i8"), "[B, W] int32 or int64"),
    "meta": ((), "a JSON string"),
    "expected": (("<f4", "<f8"), "[B * next_n, max_model_len] float32 or float64 (a golden file's logits)"),
}
_OPTIONAL_MEMBERS = ("expected",)
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError, OSError,
                   ValueError, KeyError, IndexError, struct.error, zlib.error, OverflowError, TypeError)


class _Header:
    def __init__(self, info: zipfile.ZipInfo, shape: tuple[int, ...], dtype: np.dtype, offset: int) -> None:
        self.info, self.shape, self.dtype, self.offset = info, shape, dtype, offset

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def check_case_archive(path: str | Path, where: str | None = None) -> dict[str, Any]:
    """Check a case archive without decompressing its arrays; its meta, validated (CaseMetaModel).

    The zip must hold exactly the members Case.save writes (q, kv_cache, weights, context_lens,
    block_table, meta; a golden file's `expected` too), as .npy files of format 1.0 or 2.0, stored or
    deflated, not encrypted, no object arrays. Each member's shape and dtype (read from its header)
    must be what the meta says, and its declared size exactly its header plus its data. The meta is
    the only array read, and only when its declared size fits the number of requests q declares.
    """
    where = one_line(f"{path}" if where is None else where)
    try:
        with zipfile.ZipFile(path) as archive:
            headers = _headers(archive, where)
            _fits_memory(headers, where)
            meta = _meta(archive, headers, where)
            _check_arrays(headers, meta, where)
            return meta
    except SpecError:
        raise
    except _ARCHIVE_ERRORS as exc:
        raise SpecError(where, str(path), f"a case archive (.npz) as Case.save writes it "
                        f"({type(exc).__name__}: {one_line(str(exc))[:200]})") from None


def _headers(archive: zipfile.ZipFile, where: str) -> dict[str, _Header]:
    infos = archive.infolist()
    names = [info.filename for info in infos]
    allowed = [f"{m}.npy" for m in _MEMBERS]
    seen = Counter(names)
    odd = sorted(n for n, times in seen.items() if n not in allowed or times > 1)
    if odd:
        raise SpecError(f"{where} members", shown(odd), f"each of {allowed} once at most")
    missing = [m for m in _MEMBERS if f"{m}.npy" not in names and m not in _OPTIONAL_MEMBERS]
    if missing:
        raise SpecError(f"{where} members", shown(sorted(names)), f"{[f'{m}.npy' for m in missing]} as well")
    order = ["q.npy"] + [n for n in names if n != "q.npy"]  # q first: it bounds what the others may declare
    by_name = {info.filename: info for info in infos}
    return {name[:-4]: _header(archive, by_name[name], f"{where} {name}") for name in order}


def _header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> _Header:
    if info.flag_bits & 0x1:
        raise SpecError(where, "encrypted", "an unencrypted member")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise SpecError(f"{where} compression", info.compress_type, "stored (0) or deflated (8)")
    # What a member declares is what numpy allocates: it must be a size its bytes on disk can give.
    most = info.compress_size if info.compress_type == zipfile.ZIP_STORED else \
        info.compress_size * MAX_DEFLATE_RATIO + 1024
    if info.file_size > most:
        raise SpecError(f"{where} size", info.file_size, f"at most {most} bytes: what its {info.compress_size} "
                        "bytes in the archive can hold")
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(member, max_header_size=MAX_NPY_HEADER)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(member, max_header_size=MAX_NPY_HEADER)
        else:
            raise SpecError(f"{where} version", version, "an .npy of format 1.0 or 2.0")
        offset = member.tell()
    if dtype.hasobject:
        raise SpecError(f"{where} dtype", str(dtype), "plain numbers or text (object arrays are pickles)")
    header = _Header(info, tuple(shape), dtype, offset)
    if info.file_size != offset + header.nbytes:
        raise SpecError(f"{where} size", info.file_size, f"{offset + header.nbytes} bytes: its header and "
                        f"{_n(header.nbytes)} bytes of {dtype.str} {tuple(shape)}")
    return header


def _fits_memory(headers: dict[str, _Header], where: str) -> None:
    """The arrays, as declared, must fit this host's free memory LOAD_FACTOR times over: an archive of a
    few megabytes can declare gigabytes of zeros, which would be inflated for many seconds before the
    process is killed for memory, where a case this host cannot hold is an error at once."""
    free = available_memory("cpu")
    declared = sum(header.nbytes for header in headers.values())
    if free is not None and declared * LOAD_FACTOR > free:
        raise SpecError(f"{where} size", declared, f"arrays this host can load: at most {_n(free // LOAD_FACTOR)} "
                        f"bytes, 1/{LOAD_FACTOR} of the {_n(free)} bytes this process can still allocate (loading "
                        "holds each array twice while it is read, and the cache once more while it is split)")


def _meta(archive: zipfile.ZipFile, headers: dict[str, _Header], where: str) -> dict[str, Any]:
    q, meta = headers["q"], headers["meta"]
    if len(q.shape) != 4:
        raise SpecError(f"{where} q.shape", q.shape, _MEMBERS["q"][1])
    if meta.dtype.kind != "U" or meta.shape != ():
        raise SpecError(f"{where} meta.npy dtype", f"{meta.dtype.str} {meta.shape}", "a 0-d unicode array (JSON text)")
    most = META_FIXED_CHARS + META_CHARS_PER_REQUEST * q.shape[0]
    chars = meta.dtype.itemsize // 4
    if chars > most:
        raise SpecError(f"{where} meta.npy size", chars, f"at most {most} characters for the {q.shape[0]} "
                        "requests of q")
    with archive.open(meta.info) as member:
        text = str(np.lib.format.read_array(member, allow_pickle=False))
    try:
        data = parse_json(text)
    except ValueError as exc:
        raise SpecError(f"{where} meta", shown(text), f"JSON ({exc})") from None
    validate(CaseMetaModel, data, f"{where} meta.")
    return data


def _check_arrays(headers: dict[str, _Header], meta: dict[str, Any], where: str) -> None:
    b, n, h, d = meta["B"], meta["next_n"], meta["H"], meta["D"]
    bs, top = meta["block_size"], meta["max_model_len"]
    longest = max(meta["seq_lens"], default=0)
    table = headers["block_table"].shape
    kv = headers["kv_cache"].shape
    shapes: dict[str, tuple[bool, str]] = {
        "q": (headers["q"].shape == (b, n, h, d), f"{(b, n, h, d)}"),
        "weights": (headers["weights"].shape == (b * n, h), f"{(b * n, h)}"),
        "context_lens": (headers["context_lens"].shape == (b, n), f"{(b, n)}"),
        "block_table": (len(table) == 2 and table[0] == b and -(-longest // bs) <= table[1]
                        <= -(-top // bs) + MAX_EXTRA_COLUMNS,
                        f"({b}, W) with {-(-longest // bs)} <= W <= {-(-top // bs) + MAX_EXTRA_COLUMNS}"),
        "kv_cache": (len(kv) == 4 and kv[1:] == (bs, 1, d + 4) and kv[0] * bs * (d + 4) <= MAX_POOL_BYTES,
                     f"(num_blocks, {bs}, 1, {d + 4}) of at most {_n(MAX_POOL_BYTES)} bytes"),
        "expected": (headers["expected"].shape == (b * n, top) if "expected" in headers else True,
                     f"{(b * n, top)}"),
    }
    for member, (fits, wanted) in shapes.items():
        if member not in headers:
            continue
        header = headers[member]
        dtypes, words = _MEMBERS[member]
        if header.dtype.str not in dtypes:
            raise SpecError(f"{where} {member}.dtype", header.dtype.str, f"{' or '.join(dtypes)}: {words}")
        if not fits:
            raise SpecError(f"{where} {member}.shape", header.shape, f"{wanted}: {words}, as the meta says")
