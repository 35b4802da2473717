"""CaseResult: one backend on one case, as data every layer above the runner reads.

CaseResult and the dataclasses inside it are the result record's one definition: each field's bounds
are Annotated on it (difftest.core.schema), so a stream line or report read back validates into these
classes and to_jsonable writes them.
"""

from __future__ import annotations

import dataclasses
import math

from difftest.core.kinds import CacheLayout, Device, Isolation, LengthEncoding
from difftest.core.schema import (
    MAX_BATCH,
    MAX_ITEMS,
    MAX_MODEL_LEN,
    MAX_NAME,
    MAX_POOL_BYTES,
    MAX_ROWS,
    Bool,
    Checked,
    Count,
    Float,
    Int,
    Member,
    Name,
    OneOf,
    Record,
    Text,
    TupleOf,
    bound_text,
)
from difftest.core.spec import CaseSpec
from difftest.core.verdict import Verdict
from difftest.engine.comparison import Comparison
from difftest.engine.guards import MAX_TRACEBACK_CHARS
from difftest.engine.sanitize import SanitizerReport
from difftest.engine.stability import Stability
from difftest.engine.timing import Timing


@dataclasses.dataclass(frozen=True)
class Reach(Record):
    """How far into the envelope a case went: what the reach table adds up per backend."""

    # the named edge families the case was drawn for
    families: TupleOf(Name, MAX_ITEMS, f"a list of names of at most {bound_text(MAX_NAME)} characters")
    longest: Int(0, MAX_MODEL_LEN)  # the longest sequence, in tokens
    pool_bytes: Int(0, MAX_POOL_BYTES)  # the cache the backend was handed
    batch: Int(0, 2 * MAX_BATCH)


@dataclasses.dataclass(frozen=True)
class CallMemory(Record):
    """What a call came to in memory, where that mattered: what the side-by-side rule counted it at,
    what it was measured to allocate, and whether it ran out of memory beside other calls first."""

    what = "a JSON object {counted, measured, alone, retried, ran_out}"
    counted: Count | None = None  # bytes the side-by-side rule counted (difftest.core.memory.SideBySide.counted)
    measured: Count | None = None  # peak bytes its call allocated beyond what it was handed (CUDA, large calls)
    alone: Bool = False  # whether it ran with no other call in flight
    # its first try's out-of-memory error, beside other calls: this result is its try alone
    retried: Text() | None = None
    ran_out: Bool = False  # it ran out of memory with no other call beside it: this result is that SKIP


@dataclasses.dataclass(frozen=True)
class CaseResult(Record):
    """One backend on one case."""

    backend: Name
    case: Name
    description: Text()
    rows: Int(0, MAX_ROWS)
    verdict: Member(Verdict)
    device: OneOf(Device)
    encoding: Member(LengthEncoding)  # the length encoding the backend was handed
    layout: Member(CacheLayout)
    overridden: Bool  # True when a what-if encoding/layout replaced the backend's declared one
    seconds: Float(0.0, math.inf)
    comparison: Comparison | None = None
    reason: Text() | None = None  # the exception of an ERROR, CRASH or TIMEOUT, the cause of a SKIP
    error_type: Name | None = None  # the exception's class name, for an ERROR or CRASH that raised one
    spec: Checked(CaseSpec) | None = None  # the case's spec as its meta holds it (CaseSpec.to_json)
    mutated_inputs: TupleOf(Name, 64, "a list of at most 64 input names") = ()  # input tensors the backend wrote into
    stability: Stability | None = None  # how `repeat` launches agreed; None for one launch
    isolation: Member(Isolation) | None = None  # where the call ran, when the run asked for isolation
    isolation_note: Text() | None = None  # why it ran in-process although isolation was asked for
    sanitizer: SanitizerReport | None = None  # the compute-sanitizer replay, when one was asked for
    # the physical GPU it was computed on (hardware.gpu_description); None on the CPU
    gpu: Text(MAX_NAME) | None = None
    reach: Reach | None = None
    timing: Timing | None = None  # the median of the timed launches, under `time` (difftest.engine.timing)
    # The backend's Contract.library: what it loaded (distribution, version, where from); reports written
    # before it have none.
    library: Text() = ""
    # The traceback of the exception behind an ERROR or CRASH, as formatted where it was raised (in a worker
    # process under isolation): the backend's frames, innermost last (difftest.engine.guards.formatted_traceback).
    traceback: Text(MAX_TRACEBACK_CHARS) | None = None
    # set where memory shaped the call: measured, run alone, retried or skipped; reports written before it have none
    memory: CallMemory | None = None
