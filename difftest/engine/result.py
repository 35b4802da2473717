"""CaseResult: one backend on one case, as data every layer above the runner reads.

CaseResult and the dataclasses inside it are the result record's one definition: each field's bounds
are Annotated on it (difftest.core.schema), so a stream line or report read back validates into these
classes and to_jsonable writes them.
"""

from __future__ import annotations

import dataclasses
import math

from difftest.core.kinds import (
    CacheLayout,
    Device,
    Isolation,
    LengthEncoding,
    LogitsForm,
    MetamorphicRelation,
    OperationKind,
    RaggedRelation,
    TopkRelation,
)
from difftest.core.ragged import MAX_KEYS
from difftest.core.schema import (
    MAX_BATCH,
    MAX_ITEMS,
    MAX_MODEL_LEN,
    MAX_NAME,
    MAX_POOL_BYTES,
    MAX_ROWS,
    Bool,
    Count,
    EitherOf,
    Float,
    Int,
    IntList,
    JsonFloat,
    Member,
    Name,
    OneOf,
    Record,
    Rule,
    TableOf,
    Text,
    TupleOf,
    bound_text,
    validate,
)
from difftest.core.spec import CaseSpec
from difftest.core.topk import MAX_WIDTH
from difftest.core.verdict import Verdict
from difftest.engine.comparison import Comparison
from difftest.engine.guards import MAX_TRACEBACK_CHARS
from difftest.engine.sanitize import SanitizerReport
from difftest.engine.stability import Stability
from difftest.engine.timing import Timing
from difftest.engine.topk_comparison import TopkPattern


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


RowTuple = IntList(0, MAX_ROWS, MAX_ROWS, f"a list of row indices in [0, {bound_text(MAX_ROWS)}]", as_tuple=True)


@dataclasses.dataclass(frozen=True)
class Selection(Record):
    """What a top-k stage selected against the oracle's tie-aware top-k: the selected-set headline."""

    rows: Int(0, MAX_ROWS)
    wrong_rows: RowTuple  # rows whose selected set is wrong
    wrong_tokens: Count  # over those rows: tokens the right set holds and the selection lacks
    # verdict value -> the rows showing it (a row may show several)
    symptoms: TableOf(OneOf(Verdict), RowTuple, "a table of verdict -> rows")
    first: Text() | None = None  # the first wrong row, described
    pattern: Member(TopkPattern) | None = None  # what explains every wrong row (difftest.engine.topk_comparison)


@dataclasses.dataclass(frozen=True)
class Judgement:
    """An operation's judgement of one output (difftest.core.operation.Operation.judge)."""

    verdict: Verdict
    headline: str
    comparison: Comparison | None = None  # the logits stage's row-by-row comparison (logits operations)
    selection: Selection | None = None  # the top-k stage's (top-k operations)


@dataclasses.dataclass(frozen=True)
class Violation(Record):
    """A metamorphic relation that does not hold for a backend on a case (difftest.engine.metamorphic): the
    related cases it ran (derived from the case by `relation`, so the case's own spec and seed draw them
    again), the rows where its logits do not follow from its logits on the case, and the first position."""

    relation: Member(MetamorphicRelation)
    related: TupleOf(Name, 16, "a list of related case names")  # the related cases' names: '<case>~<relation>'
    # rows of the case (or padding rows of the related case) where it does not hold
    rows: TupleOf(Int(0, MAX_ROWS), MAX_ROWS, "a list of row indices")
    row: Int(0, MAX_ROWS)  # the first such row, of the case
    position: Int(0, MAX_MODEL_LEN)
    original: JsonFloat  # the backend's logit there on the case
    related_value: JsonFloat  # and on the related case, at the row and position it moved to
    expected: JsonFloat  # what the relation makes of `original`
    exact: Bool  # compared bit for bit (else within the contract's rtol)
    note: Text() = ""  # how the related case was made, and why so (scale-q: which tensor was scaled)

    def describe(self) -> str:
        """'scale-q (q x 2): 3 rows, first row 1, position 7: x on the case, y on the related case, z expected'."""
        how = "bit for bit" if self.exact else "within rtol"
        note = f" ({self.note})" if self.note else ""
        return (f"{self.relation.value}{note} does not hold {how} on {len(self.rows)} rows; first row {self.row}, "
                f"position {self.position}: {self.original!r} on the case, {self.related_value!r} on "
                f"{', '.join(self.related)}, {self.expected!r} expected")


@dataclasses.dataclass(frozen=True)
class TopkViolation(Record):
    """A top-k metamorphic relation that does not hold for a backend on a case (difftest.engine.topk_metamorphic):
    the related case (derived from the case by `relation` with a fixed seed, so the case and the relation draw it
    again), the rows whose chosen candidates or pads do not follow from the case's, and the first such row's
    chosen candidate values (descending) and pads on either side; or, with no rows, why the related case gave
    no answer to relate (`note`)."""

    relation: Member(TopkRelation)
    related: Name  # the related case's name: '<case>~<relation>'
    rows: RowTuple
    row: Int(0, MAX_ROWS)
    chosen: TupleOf(JsonFloat, MAX_WIDTH, "a list of values")  # the first row's chosen values on the case
    related_chosen: TupleOf(JsonFloat, MAX_WIDTH, "a list of values")  # and on the related case
    pads: Int(0, MAX_WIDTH)
    related_pads: Int(0, MAX_WIDTH)
    expected_pads: Int(-MAX_WIDTH, MAX_WIDTH)  # the case's pads less what the contract's rule takes away
    note: Text() = ""

    def describe(self) -> str:
        """'add-neg-inf does not hold on 2 rows; first row 0: 5 candidates chosen and 11 pads on the case (largest
        [..]), 5 and 0 on c~add-neg-inf (largest [..]), where 11 pads follow', or the relation, the related case
        and the note when the related case gave no answer."""
        if not self.rows:
            return f"{self.relation.value} on {self.related}: {self.note}"
        rows = f"{len(self.rows)} row{'s' if len(self.rows) > 1 else ''}"
        return (f"{self.relation.value} does not hold on {rows}; first row {self.row}: {len(self.chosen)} candidates "
                f"chosen and {self.pads} pads on the case (largest {_shown(self.chosen)}), {len(self.related_chosen)} "
                f"and {self.related_pads} on {self.related} (largest {_shown(self.related_chosen)}), where "
                f"{self.expected_pads} pads follow")


def _shown(values: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values[:4]) + (", ...]" if len(values) > 4 else "]")


@dataclasses.dataclass(frozen=True)
class RaggedViolation(Record):
    """A ragged logits relation that does not hold for a backend on a case (difftest.engine.ragged_metamorphic):
    the related cases (derived from the case by `relation` with a fixed seed, so the case and the relation draw
    them again), the rows of the case whose logits on them do not follow from its logits on the case, and the
    first position, a column of the related output in the contract's form (absolute: a key; window-relative: an
    offset from the window's start); or, with no rows, why a related case gave no answer to relate (`note`)."""

    relation: Member(RaggedRelation)
    related: TupleOf(Name, 16, "a list of related case names")  # '<case>~<relation>' (split-rows: two halves)
    form: Member(LogitsForm)  # the output form `column` counts in (a ragged violation's mark, read back from JSON)
    rows: RowTuple  # rows of the case where it does not hold
    row: Int(0, MAX_ROWS)  # the first such row, of the case
    related_row: Int(0, MAX_ROWS)  # the row of the related output it moved to
    column: Int(0, 2 * MAX_KEYS)  # the first wrong column of that related row
    original: JsonFloat  # the backend's logit on the case that this column follows from (-inf: from none)
    related_value: JsonFloat  # the backend's logit there on the related case
    expected: JsonFloat  # what the relation makes of `original`
    note: Text() = ""  # how the related case was made (scale-q: which tensor was doubled), or why no answer

    def describe(self) -> str:
        """'shift-keys (3 keys inserted before the buffer) does not hold within rtol on 2 rows; first row 1: 1.5 on
        the case, -inf on c~shift-keys (row 1, absolute column 7), 1.5 expected', or the relation, the related
        cases and the note when one gave no answer."""
        note = f" ({self.note})" if self.note else ""
        if not self.rows:
            return f"{self.relation.value} on {', '.join(self.related)}{note}"
        rows = f"{len(self.rows)} row{'s' if len(self.rows) > 1 else ''}"
        joined = ", their rows end to end" if len(self.related) > 1 else ""
        return (f"{self.relation.value}{note} does not hold within rtol on {rows}; first row {self.row}: "
                f"{self.original!r} on the case, {self.related_value!r} on {', '.join(self.related)} (row "
                f"{self.related_row}, {self.form.value} column {self.column}{joined}), {self.expected!r} expected")


def _violation_kind(violation: object) -> str:
    """'ragged' for a ragged relation's violation (as JSON: it alone has a `form`; or a RaggedViolation), 'topk'
    for a top-k relation's, else 'paged'. The ragged relations share names with the paged ones, so the name
    alone cannot say."""
    if isinstance(violation, RaggedViolation) or (isinstance(violation, dict) and "form" in violation):
        return "ragged"
    relation = violation.get("relation") if isinstance(violation, dict) else getattr(violation, "relation", None)
    # a relation read from JSON may be any value, a list too: only a name can be a top-k relation's
    return "topk" if isinstance(relation, str) and relation in {r.value for r in TopkRelation} else "paged"


# A paged-logits result's spec is a CaseSpec (checked as one: CaseResult.checked); another operation's is its own
# spec's JSON, checked here as a JSON object only (its operation's from_json reads it).
SpecJson = Rule(lambda v: type(v) is dict and len(v) <= 64, "a JSON object of at most 64 spec fields").type(dict)


@dataclasses.dataclass(frozen=True)
class CaseResult(Record):
    """One backend on one case."""

    backend: Name
    case: Name
    description: Text()
    rows: Int(0, MAX_ROWS)
    verdict: Member(Verdict)
    device: OneOf(Device)
    # the length encoding the backend was handed (None: not a paged operation)
    encoding: Member(LengthEncoding) | None
    layout: Member(CacheLayout) | None
    overridden: Bool  # True when a what-if encoding/layout replaced the backend's declared one
    seconds: Float(0.0, math.inf)
    comparison: Comparison | None = None
    reason: Text() | None = None  # the exception of an ERROR, CRASH or TIMEOUT, the cause of a SKIP
    error_type: Name | None = None  # the exception's class name, for an ERROR or CRASH that raised one
    spec: SpecJson | None = None  # the case's spec as its meta holds it (its spec's to_json)
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
    # what was tested; reports written before it: paged
    operation: Member(OperationKind) = OperationKind.PAGED_LOGITS
    selection: Selection | None = None  # a top-k stage's selected set against the oracle's
    headline: Text() | None = None  # an operation's one-line judgement (paged logits: None, the comparison says it)
    # the relations it violated, if checked (a top-k result's are TopkViolations, a ragged one's RaggedViolations)
    metamorphic: TupleOf(EitherOf(_violation_kind, "a violated relation", paged=Violation, topk=TopkViolation,
                                  ragged=RaggedViolation), 64, "a list of violated relations") = ()

    def checked(self) -> None:
        """A paged-logits result's spec is a CaseSpec."""
        if self.operation == OperationKind.PAGED_LOGITS and self.spec is not None:
            validate(CaseSpec, self.spec, "spec.")
