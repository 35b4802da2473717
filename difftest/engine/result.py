"""CaseResult: one backend on one case, as data every layer above the runner reads."""

from __future__ import annotations

import dataclasses

from difftest.core.kinds import CacheLayout, Isolation, LengthEncoding, MetamorphicRelation, OperationKind
from difftest.core.verdict import Verdict
from difftest.engine.comparison import Comparison
from difftest.engine.sanitize import SanitizerReport
from difftest.engine.stability import Stability
from difftest.engine.timing import Timing


@dataclasses.dataclass(frozen=True)
class Reach:
    """How far into the envelope a case went: what the reach table adds up per backend."""

    families: tuple[str, ...]  # the named edge families the case was drawn for
    longest: int  # the longest sequence, in tokens
    pool_bytes: int  # the cache the backend was handed
    batch: int


@dataclasses.dataclass(frozen=True)
class CallMemory:
    """What a call came to in memory, where that mattered: what the side-by-side rule counted it at,
    what it was measured to allocate, and whether it ran out of memory beside other calls first."""

    counted: int | None = None  # bytes the side-by-side rule counted (difftest.core.memory.SideBySide.counted)
    measured: int | None = None  # peak bytes its call allocated beyond what it was handed (CUDA, large calls)
    alone: bool = False  # whether it ran with no other call in flight
    # its first try's out-of-memory error, beside other calls: this result is its try alone
    retried: str | None = None
    ran_out: bool = False  # it ran out of memory with no other call beside it: this result is that SKIP


@dataclasses.dataclass(frozen=True)
class Selection:
    """What a top-k stage selected against the oracle's tie-aware top-k: the selected-set headline."""

    rows: int
    wrong_rows: tuple[int, ...]  # rows whose selected set is wrong
    wrong_tokens: int  # over those rows: tokens the right set holds and the selection lacks
    symptoms: dict[str, tuple[int, ...]]  # verdict value -> the rows showing it (a row may show several)
    first: str | None = None  # the first wrong row, described


@dataclasses.dataclass(frozen=True)
class Judgement:
    """An operation's judgement of one output (difftest.core.operation.Operation.judge)."""

    verdict: Verdict
    headline: str
    comparison: Comparison | None = None  # the logits stage's row-by-row comparison (logits operations)
    selection: Selection | None = None  # the top-k stage's (top-k operations)


@dataclasses.dataclass(frozen=True)
class Violation:
    """A metamorphic relation that does not hold for a backend on a case (difftest.engine.metamorphic): the
    related cases it ran (derived from the case by `relation`, so the case's own spec and seed draw them
    again), the rows where its logits do not follow from its logits on the case, and the first position."""

    relation: MetamorphicRelation
    related: tuple[str, ...]  # the related cases' names: '<case>~<relation>'
    rows: tuple[int, ...]  # rows of the case (or padding rows of the related case) where it does not hold
    row: int  # the first such row, of the case
    position: int
    original: float  # the backend's logit there on the case
    related_value: float  # and on the related case, at the row and position it moved to
    expected: float  # what the relation makes of `original`
    exact: bool  # compared bit for bit (else within the contract's rtol)
    note: str = ""  # how the related case was made, and why so (scale-q: which tensor was scaled)

    def describe(self) -> str:
        """'scale-q (q x 2): 3 rows, first row 1, position 7: x on the case, y on the related case, z expected'."""
        how = "bit for bit" if self.exact else "within rtol"
        note = f" ({self.note})" if self.note else ""
        return (f"{self.relation.value}{note} does not hold {how} on {len(self.rows)} rows; first row {self.row}, "
                f"position {self.position}: {self.original!r} on the case, {self.related_value!r} on "
                f"{', '.join(self.related)}, {self.expected!r} expected")


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """One backend on one case."""

    backend: str
    case: str
    description: str
    rows: int
    verdict: Verdict
    device: str
    encoding: LengthEncoding | None  # the length encoding the backend was handed (None: not a paged operation)
    layout: CacheLayout | None
    overridden: bool  # True when a what-if encoding/layout replaced the backend's declared one
    seconds: float
    comparison: Comparison | None = None
    reason: str | None = None  # the exception of an ERROR, CRASH or TIMEOUT, the cause of a SKIP
    error_type: str | None = None  # the exception's class name, for an ERROR or CRASH that raised one
    spec: dict[str, object] | None = None
    mutated_inputs: tuple[str, ...] = ()  # input tensors the backend wrote into
    stability: Stability | None = None  # how `repeat` launches agreed; None for one launch
    isolation: Isolation | None = None  # where the call ran, when the run asked for isolation
    isolation_note: str | None = None  # why it ran in-process although isolation was asked for
    sanitizer: SanitizerReport | None = None  # the compute-sanitizer replay, when one was asked for
    gpu: str | None = None  # the physical GPU it was computed on (hardware.gpu_description); None on the CPU
    reach: Reach | None = None
    timing: Timing | None = None  # the median of the timed launches, under `time` (difftest.engine.timing)
    library: str = ""  # the backend's Contract.library: what it loaded (distribution, version, where from)
    # The traceback of the exception behind an ERROR or CRASH, as formatted where it was raised (in a worker
    # process under isolation): the backend's frames, innermost last (difftest.engine.guards.formatted_traceback).
    traceback: str | None = None
    memory: CallMemory | None = None  # set where memory shaped the call: measured, run alone, retried or skipped
    operation: OperationKind = OperationKind.PAGED_LOGITS  # what was tested; reports written before it: paged
    selection: Selection | None = None  # a top-k stage's selected set against the oracle's
    headline: str | None = None  # an operation's one-line judgement (paged logits: None, the comparison says it)
    metamorphic: tuple[Violation, ...] = ()  # the relations it violated, when the run checked them
