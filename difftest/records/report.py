"""Reports: the per-backend table with the -inf-mask headline, the results per GPU, failure details, JSON and JSONL.

The JSON report (write_json) is written once at the end: the run, the summaries, every result.
The JSONL stream and reading results back live in difftest.records.serialize.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import statistics
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from difftest import __version__
from difftest.core.files import atomic_write
from difftest.core.kinds import Headline, OperationKind, TimedRegion
from difftest.core.schema import (
    MAX_ITEMS,
    MAX_NAME,
    Checked,
    Count,
    Float,
    JsonFloat,
    ListOf,
    Member,
    Name,
    NonNegative,
    OneOf,
    Record,
    TableOf,
    Text,
)
from difftest.core.verdict import Verdict, worst
from difftest.engine.comparison import STRIP_LEGEND, Comparison
from difftest.engine.config import RunConfig
from difftest.engine.explain import Example, Explanation, Pattern, Relation, Rounding
from difftest.engine.performance import SiblingRace, format_seconds, races
from difftest.engine.plan import EnvelopePlan
from difftest.engine.result import CaseResult
from difftest.engine.stability import Stability, StabilityKind
from difftest.operations import operation
from difftest.records.run_info import RunInfoModel
from difftest.records.score import SelftestScore


@dataclasses.dataclass(frozen=True)
class BackendSummary(Record):
    """One backend over a whole run."""

    backend: Name
    cases: Count  # cases it ran (not skipped)
    skipped: Count
    rows: Count  # rows compared
    mask_rows: Count  # rows with a wrong -inf mask: the headline numerator
    max_rel_err: NonNegative
    # the lowest of its cases' top-k overlaps; None where no case had one (n/a); 'nan' in older reports
    topk_overlap: JsonFloat | None
    verdict: Member(Verdict)
    counts: TableOf(OneOf(Verdict), Count, "a table of verdict -> cases")  # verdict -> cases
    skip_reasons: ListOf(Text(), MAX_ITEMS, "a list of skip reasons")
    stability: Text(MAX_NAME) | None = None  # the least stable kind over its repeated cases, with the launches
    # Reports written before the time column have none of these.
    seconds: Float(0.0, math.inf) = 0.0  # its calls' seconds over the cases it ran (CaseResult.seconds), summed
    median_seconds: Float(0.0, math.inf) = 0.0  # the median of those per case
    # under --time: the median over its cases of their median timed launch
    kernel_seconds: Float(0.0, math.inf) | None = None
    timed_region: Member(TimedRegion) | None = None  # what those launches covered
    # What it loaded (Contract.library), as its results name it; '; '-joined where they name several (a
    # resumed run whose earlier part loaded another version). Reports written before it have none.
    library: Text() = ""
    # Reports written before operations have none of these (paged logits).
    operation: Member(OperationKind) = OperationKind.PAGED_LOGITS
    selected_rows: Count = 0  # rows a top-k stage selected for (the selected-set headline's denominator)
    set_rows: Count = 0  # rows whose selected set is wrong: the top-k headline's numerator
    wrong_tokens: Count = 0  # tokens the right sets hold and the selections lack, over those rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class Report(Record):
    """A JSON report (write_json): how the run was made (run info, kept as written), the summaries, every
    result, the sibling races of a --time run and, from `difftest selftest`, its score."""

    what = "a JSON report {run, summaries, results}"
    run: Checked(RunInfoModel) = dataclasses.field(default_factory=dict)
    summaries: ListOf(BackendSummary, MAX_ITEMS, "a list of backend summaries") = dataclasses.field(
        default_factory=list)
    results: ListOf(CaseResult, 1 << 30, "a list of results")
    performance: ListOf(SiblingRace, 1 << 30, "a list of sibling races (--time)") = dataclasses.field(
        default_factory=list)
    selftest: SelftestScore | None = None  # `difftest selftest`'s score (a report of anything else has none)

    def dumped(self, out: dict[str, object]) -> dict[str, object]:
        """The report as write_json writes it: a `selftest` section only where there is a score."""
        return out if self.selftest is not None else {key: value for key, value in out.items() if key != "selftest"}


def summarize(results: list[CaseResult]) -> list[BackendSummary]:
    """One summary per backend, in the order backends first appear."""
    names = list(dict.fromkeys(r.backend for r in results))
    return [_summary(name, [r for r in results if r.backend == name]) for name in names]


def _summary(name: str, results: list[CaseResult]) -> BackendSummary:
    compared = [r.comparison for r in results if r.comparison is not None]
    ran = [r for r in results if r.verdict != Verdict.SKIP]
    verdicts = [r.verdict for r in results]
    counts = {v.value: verdicts.count(v) for v in Verdict if v in verdicts}
    overall = Verdict.SKIP if not ran else worst([r.verdict for r in ran])
    return BackendSummary(
        backend=name, cases=len(ran), skipped=len(results) - len(ran),
        rows=sum(c.rows for c in compared), mask_rows=sum(len(c.mask_rows) for c in compared),
        max_rel_err=max((c.max_rel_err for c in compared), default=0.0),
        topk_overlap=min((c.topk_overlap for c in compared if c.topk_overlap is not None), default=None),
        verdict=overall, counts=counts,
        skip_reasons=sorted({r.reason or "" for r in results if r.verdict == Verdict.SKIP}),
        stability=_least_stable([r.stability for r in results if r.stability is not None]),
        library="; ".join(dict.fromkeys(r.library for r in results if r.library)), **_times(ran),
        operation=results[0].operation, **_selected(results))


def _selected(results: list[CaseResult]) -> dict[str, int]:
    """The selected-set columns of a backend's summary, over the results a top-k stage judged."""
    selections = [r.selection for r in results if r.selection is not None]
    return dict(selected_rows=sum(s.rows for s in selections), set_rows=sum(len(s.wrong_rows) for s in selections),
                wrong_tokens=sum(s.wrong_tokens for s in selections))


def _times(ran: list[CaseResult]) -> dict[str, Any]:
    """The time columns of a backend's summary: its calls' seconds (total, median per case) and,
    under --time, the median of its cases' median timed launches and what those covered."""
    seconds = [r.seconds for r in ran]
    timed = [r.timing for r in ran if r.timing is not None and r.timing.error is None]
    return dict(seconds=sum(seconds), median_seconds=statistics.median(seconds) if seconds else 0.0,
                kernel_seconds=statistics.median(t.median for t in timed) if timed else None,
                timed_region=timed[0].region if timed else None)


def _least_stable(stabilities: list[Stability]) -> str | None:
    """'bitwise-stable x3', 'unstable x3', ...: the least stable of the cases and its launch count."""
    order = list(StabilityKind)
    least = max(stabilities, key=lambda s: order.index(s.kind), default=None)
    return None if least is None else f"{least.kind.value} x{least.launches}"


def headline(summary: BackendSummary) -> str:
    """'48/48 rows with the wrong -inf mask': the number a kernel engineer reads first."""
    return f"{summary.mask_rows}/{summary.rows} rows with the wrong -inf mask"


def render_table(summaries: list[BackendSummary]) -> str:
    """The fixed-width table `difftest run` ends with: the time columns are each backend's calls,
    total and per case, and under --time the median kernel launch; then what each backend loaded. The
    headline columns are those of the operations tested (Operation.headlines): the -inf-mask mismatch of a
    logits stage, the wrong selected sets (and tokens off) of a top-k stage."""
    if any(s.operation != OperationKind.PAGED_LOGITS for s in summaries):
        return _operation_table(summaries)
    timed = any(s.kernel_seconds is not None for s in summaries)
    header = (f"{'backend':<28} {'cases':>5} {'rows':>6}  {'-inf-mask mismatch':<18}  "
              f"{'max rel err':>11}  {'top-k overlap':>13}  {'time':>8} {'per case':>8}  "
              + (f"{'kernel':>9}  " if timed else "") + "verdict")
    lines = [header]
    for s in summaries:
        overlap = "-" if not s.rows else "n/a" if s.topk_overlap is None else f"{s.topk_overlap:.3f}"
        err = "-" if not s.rows else f"{s.max_rel_err:.2e}" if s.max_rel_err else "0"
        mismatch = f"{s.mask_rows}/{s.rows}" if s.cases else "-"
        verdict = s.verdict.value if s.verdict != Verdict.PASS or not s.skipped else f"PASS ({s.skipped} skipped)"
        if s.verdict == Verdict.SKIP:
            verdict = f"SKIP: {s.skip_reasons[0] if s.skip_reasons else ''}"
        if s.stability:
            verdict += f" [{s.stability}]"
        lines.append(f"{s.backend:<28} {s.cases:>5} {s.rows:>6}  {mismatch:<18}  {err:>11}  "
                     f"{overlap:>13}  {_time_cells(s, timed)}{verdict}")
    if any(s.timed_region == TimedRegion.WHOLE_CALL for s in summaries):
        lines.append(WHOLE_CALL_NOTE)
    if any(s.rows and s.topk_overlap is None for s in summaries):
        lines.append(TOPK_NA_NOTE)
    return "\n".join(lines + _library_lines(summaries))


def headlines(kind: OperationKind) -> tuple[Headline, ...]:
    """The headline columns an operation declares (difftest.operations)."""
    return operation(kind).headlines


def _operation_table(summaries: list[BackendSummary]) -> str:
    """The table of a run of operations other than paged logits: the operation, its headline columns ('-' where
    an operation has no such stage), the largest relative error of a logits stage, the verdict."""
    lines = [f"{'backend':<30} {'operation':<13} {'cases':>5} {'rows':>6}  {'-inf-mask mismatch':<18}  "
             f"{'wrong set (tokens)':<20}  {'max rel err':>11}  verdict"]
    for s in summaries:
        heads = headlines(s.operation)
        mask = f"{s.mask_rows}/{s.rows}" if s.cases and Headline.MASK in heads else "-"
        chosen = f"{s.set_rows}/{s.selected_rows} ({s.wrong_tokens})" if s.cases and Headline.SELECTION in heads \
            else "-"
        err = "-" if not s.rows else f"{s.max_rel_err:.2e}" if s.max_rel_err else "0"
        verdict = s.verdict.value if s.verdict != Verdict.PASS or not s.skipped else f"PASS ({s.skipped} skipped)"
        if s.verdict == Verdict.SKIP:
            verdict = f"SKIP: {s.skip_reasons[0] if s.skip_reasons else ''}"
        lines.append(f"{s.backend:<30} {s.operation.value:<13} {s.cases:>5} {max(s.rows, s.selected_rows):>6}  "
                     f"{mask:<18}  {chosen:<20}  {err:>11}  {verdict}")
    return "\n".join(lines + _library_lines(summaries))


def _library_lines(summaries: list[BackendSummary]) -> list[str]:
    """After a blank line, what each backend loaded (Contract.library), for those that say: below the
    table, which has no room for a version and the path it came from, and indented, so that the
    table's row is still the one line that starts with the backend's name."""
    named = [s for s in summaries if s.library]
    if not named:
        return []
    return ["", "libraries loaded:"] + [f"  {s.backend:<26} {s.library}" for s in named]


TOPK_NA_NOTE = ("* top-k overlap n/a: no row's window is longer than the k its top-k keeps (the contract's topk, 2048 "
                "by default), so the top-k would keep every position whatever the values")
WHOLE_CALL_NOTE = ("* whole call timed: the backend declares no prepare(), so its per-batch set-up (a schedule, "
                   "metadata) is timed with the kernel")


def _time_cells(s: BackendSummary, timed: bool) -> str:
    """'1.23 s  41.2 ms  ' (and the kernel cell under --time, '*' marking a whole call), '-' where it ran nothing."""
    total, per_case = (format_seconds(s.seconds), format_seconds(s.median_seconds)) if s.cases else ("-", "-")
    cells = f"{total:>8} {per_case:>8}  "
    if not timed:
        return cells
    kernel = "-" if s.kernel_seconds is None else format_seconds(s.kernel_seconds)
    return cells + f"{kernel + ('*' if s.timed_region == TimedRegion.WHOLE_CALL else ''):>9}  "


def render_devices(results: list[CaseResult]) -> str:
    """'results per device: cuda:0 NVIDIA H200 (PCI ...): 44, cuda:0 NVIDIA H200 (PCI ...): 44' when the
    results were computed on more than one GPU (CaseResult.gpu); '' otherwise."""
    counts = Counter(r.gpu for r in results if r.gpu is not None)
    if len(counts) < 2:
        return ""
    return "results per device: " + ", ".join(f"{gpu}: {n}" for gpu, n in counts.items())


TRACEBACK_LINES = 12  # lines of a traceback a failure block shows unless asked for all: the innermost frames


def render_failures(results: list[CaseResult], limit: int = 20,
                    repro: Mapping[tuple[str, str], str] | None = None, whole_tracebacks: bool = False) -> str:
    """One block per failing (backend, case): verdict, mask rows, first mismatch or the error with its
    traceback (the last TRACEBACK_LINES lines, or all of it with `whole_tracebacks`), what the guards
    found (inputs written, launches disagreeing, sanitizer errors), and last the command line that runs
    it again, where `repro` (by backend and case) has one (difftest.records.commands)."""
    lines = []
    for r in [r for r in results if r.verdict.failed][:limit]:
        fed = f"encoding {r.encoding.value}{', overridden' if r.overridden else ''}" if r.encoding else \
            r.operation.value
        lines.append(f"{r.backend} on {r.case} [{r.description}]: {r.verdict.value} ({fed})")
        again = (repro or {}).get((r.backend, r.case))
        repro_lines = [f"repro: {again}"] if again else []
        lines += [f"    {line}" for line in _comparison_lines(r) + _traceback_lines(r, whole_tracebacks)
                  + _guard_lines(r) + repro_lines]
    hidden = sum(r.verdict.failed for r in results) - limit
    if hidden > 0:
        lines.append(f"... and {hidden} more failing results in the JSON report")
    return "\n".join(lines)


def render_results(results: list[CaseResult]) -> str:
    """One line per result, passing and skipped ones too: backend, case, verdict, seconds, and the
    reason of a SKIP or an ERROR."""
    return "\n".join(f"{r.backend} on {r.case} [{r.description}]: {r.verdict.value} in {r.seconds:.3f} s"
                     + (f": {r.reason}" if r.reason else "") for r in results)


def _comparison_lines(r: CaseResult) -> list[str]:
    if r.headline is not None:  # an operation's own judgement in one line, and its logits' pattern where one fits
        explained = r.comparison.explanation if r.comparison is not None else None
        return ([r.headline] + ([f"selection: {r.selection.first}"] if r.selection and r.selection.first else [])
                + (explanation_lines(explained) if explained is not None else []))
    if r.comparison is None:
        return [r.reason or ""]
    c = r.comparison
    lines = [f"{len(c.mask_rows)}/{c.rows} rows with the wrong -inf mask {_few(c.mask_rows)}; "
             f"NaN rows {_few(c.nan_rows)}; unwritten rows {_few(c.unwritten_rows)}; "
             f"value rows {_few(c.value_rows)}"]
    if c.first_mismatch:
        m = c.first_mismatch
        lines.append(f"first mismatch: row {m.row}, position {m.position}: expected {m.expected!r}, "
                     f"got {m.got!r} ({m.kind.value})")
    # A judged result carries a reason only where no oracle judged it (consensus: against which peer, and whom
    # the relations fault).
    return lines + ([f"consensus: {r.reason}"] if r.reason else []) + _mask_lines(c)


def _traceback_lines(r: CaseResult, whole: bool) -> list[str]:
    """The result's traceback, indented, cut to its last TRACEBACK_LINES lines unless `whole`."""
    if not r.traceback:
        return []
    lines = r.traceback.rstrip("\n").splitlines()
    cut = 0 if whole else max(0, len(lines) - TRACEBACK_LINES)
    head = [f"traceback (its last {len(lines) - cut} of {len(lines)} lines; the whole of it in the JSON report):"] \
        if cut else ["traceback:"]
    return head + [f"  {line}" for line in lines[cut:]]


def _mask_lines(c: Comparison, shown: int = 4) -> list[str]:
    """Why the masks are wrong: the relation and its evidence, a few rows' limits (the oracle's and the
    one the kernel behaved as if it had), and the first wrong row's mask around its boundaries."""
    lines = explanation_lines(c.explanation) if c.explanation is not None else []
    for row, oracle, apparent in c.mask_limits[:shown]:
        behaved = "a mask that is not a prefix (-inf between values)" if apparent is None else apparent
        lines.append(f"row {row}: oracle limit {oracle}, kernel behaved as {behaved}")
    if c.mask_strip:
        lines += [f"mask: {c.mask_strip}", f"      ({STRIP_LEGEND})"]
    return lines


def explanation_lines(e: Explanation) -> list[str]:
    """'pattern: (16 of 16 wrong rows) reversed draft rows: ...', then which draft rows are wrong, an
    example row and the other relations that fit as exactly."""
    lines = [f"pattern: ({e.explained} of {e.rows} wrong rows) {describe(e)}"]
    if e.next_n is not None and e.next_n > 1 and e.draft_rows:
        right = [j for j in range(e.next_n) if j not in e.draft_rows]
        lines.append(f"wrong draft rows: j = {', '.join(map(str, e.draft_rows))} of next_n {e.next_n}"
                     + (f" (j = {', '.join(map(str, right))} right)" if right else " (every one)"))
    if e.example is not None:
        lines.append(f"e.g. {_example(e.example)}")
    if e.alternatives:
        lines.append(f"also fits: {'; '.join(relation_name(r) for r in e.alternatives)}")
    return lines


def relation_name(relation: Relation) -> str:
    """A relation in a few words with its parameters: 'constant offset -1', 'tile-truncated (down to 64)'."""
    p = relation.pattern
    if p == Pattern.CONSTANT_OFFSET:
        return f"constant offset {_signed(relation.offset)}"
    if p == Pattern.TILE_TRUNCATED:
        way = "" if relation.rounding is None else f"{relation.rounding.value} "
        return f"tile-truncated ({way}to {relation.tile if relation.tile is not None else 'a tile'})"
    if p == Pattern.ROTATED_DRAFT_ROWS:
        return "rotated draft rows" + ("" if relation.shift is None else f" (j + {relation.shift})")
    if p == Pattern.SHIFTED_REQUEST:
        return "shifted request" + ("" if relation.shift is None else f" (b {'-' if relation.shift > 0 else '+'} "
                                                                        f"{abs(relation.shift)})")
    return _NAMES[p]


_NAMES = {Pattern.NO_WINDOW: "no window", Pattern.PER_SEQUENCE_LENGTH: "per-sequence length",
          Pattern.REVERSED_DRAFT_ROWS: "reversed draft rows", Pattern.MTP_MIRRORED: "AITER's mirrored MTP window",
          Pattern.TAIL_NOT_CLEANED: "tail not cleaned", Pattern.UNKNOWN: "no known pattern fits",
          Pattern.AFTER_EMPTY_REQUEST: "the request after an empty one"}


def describe(e: Explanation) -> str:
    """The named relation of `e` and what it means for a row, in words."""
    return f"{relation_name(e.relation)}: {_meaning(e)}"


_MEANINGS = {
    Pattern.NO_WINDOW: "every wrong row is -inf from position 0",
    Pattern.PER_SEQUENCE_LENGTH: "each row of a request sees L, the sequence's length, instead of L - next_n + j + 1 "
                                 "(the MTP offset forgotten)",
    Pattern.REVERSED_DRAFT_ROWS: "row j sees L - j positions, the window of row next_n - 1 - j",
    Pattern.AFTER_EMPTY_REQUEST: "every wrong row is in a request right after an empty one (L = 0), its mask right and "
                                 "its values not: scored with the empty request's q and weights (DeepGEMM 2.8.1)",
    Pattern.MTP_MIRRORED: "row j sees L - j + 1 positions (p <= L - j), the window of row next_n - j, instead of "
                          "L - next_n + j + 1",
}


def _meaning(e: Explanation) -> str:
    meaning = _MEANINGS.get(e.pattern) or _with_parameters(e)
    if not e.selective:
        return meaning
    if e.pattern == Pattern.NO_WINDOW:
        return f"{meaning}; {e.right_windows} other rows with a window are right"
    return f"{meaning}; the other {e.right_windows} rows with a window are right, so a condition picks the rows"


def _with_parameters(e: Explanation) -> str:
    """What a relation with parameters (or the evidence's numbers) means for a row."""
    r = e.relation
    if r.pattern == Pattern.CONSTANT_OFFSET:
        short = {-1: " (window one short)", 1: " (window one long)"}.get(r.offset or 0, "")
        return f"every {'wrong ' if e.selective else ''}row's window is the oracle's {_signed(r.offset)}{short}"
    if r.pattern == Pattern.TILE_TRUNCATED:
        dropped = "the partial last tile dropped" if r.rounding == Rounding.DOWN else "the last tile stored whole"
        return f"each window rounded to a multiple of the declared tile ({dropped})"
    if r.pattern == Pattern.SHIFTED_REQUEST:
        return _shift_meaning(r.shift)
    if r.pattern == Pattern.ROTATED_DRAFT_ROWS:
        return (f"row j sees the window of row (j + {r.shift}) mod next_n: a draft-row index off by one, wrapping "
                f"within the request")
    if r.pattern == Pattern.TAIL_NOT_CLEANED:
        return f"finite values past the oracle's window on every wrong row ({e.holes} of them with -inf between values)"
    return "kernel - oracle limit is " + ", ".join(f"{'not a prefix (holes)' if d is None else _signed(d)} on {n}"
                                                  for d, n in e.differences)


def _shift_meaning(shift: int | None) -> str:
    if shift is None:  # an older report's shift by one request, its direction not recorded
        return "the rows of a request see a neighbouring request's limits"
    n = abs(shift)
    return (f"the rows of request b see request b {'-' if shift > 0 else '+'} {n}'s limits (the lengths read "
            f"{n} request{'s' if n > 1 else ''} {'late' if shift > 0 else 'early'})")


def _signed(value: int | None) -> str:
    return "(not recorded)" if value is None else f"{value:+d}"


def _example(x: Example) -> str:
    """'row 5 (request 1, j 2, L 14): oracle limit 14, kernel 12'."""
    where = "" if x.request is None else f" (request {x.request}, j {x.draft_row}, L {x.length})"
    return f"row {x.row}{where}: oracle limit {x.oracle}, kernel {'not a prefix' if x.kernel is None else x.kernel}"


def _guard_lines(r: CaseResult) -> list[str]:
    lines = []
    if r.mutated_inputs:
        lines.append(f"wrote into its inputs: {', '.join(r.mutated_inputs)}")
    s = r.stability
    if s is not None and s.kind != StabilityKind.BITWISE:
        lines.append(f"{s.kind.value} over {s.launches} launches: rows {_few(s.moved_rows)} moved, "
                     f"{_few(s.unstable_rows)} past the tolerance (max |diff| {s.max_abs_diff:.3g})")
    if r.sanitizer is not None:
        lines.append(r.sanitizer.summary())
    lines += [f"metamorphic: {violation.describe()}" for violation in r.metamorphic]
    return lines


def _few(rows: list[int], shown: int = 8) -> str:
    if not rows:
        return "none"
    text = ",".join(map(str, rows[:shown]))
    return f"[{text}{',...' if len(rows) > shown else ''}]"


def config_info(config: RunConfig) -> dict[str, Any]:
    """How `config` fed the backends, as a report's run info records it."""
    return {"encoding_override": config.encoding.value if config.encoding else None,
            "layout_override": config.layout.value if config.layout else None, "isolated": config.isolated,
            "timeout": config.timeout, "repeat": config.repeat,
            "sanitize": config.sanitize.value if config.sanitize else None, "sanitize_all": config.sanitize_all,
            "oracle": config.oracle_kind.value, "startup_timeout": config.startup_timeout, "time": config.time,
            "graph": config.graph}


def environment_info(started: float) -> dict[str, Any]:
    """What a run ran with, and when it started (time.time()), as a report's run info records it."""
    return {"torch": torch.__version__, "difftest": __version__, "python": platform.python_version(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}


def write_json(path: str | Path, results: list[CaseResult], run_info: dict[str, Any],
               selftest: SelftestScore | None = None) -> Path:
    """The whole run: how it was made, the summaries, every result and the sibling races of a --time run
    (difftest.engine.performance), then the score of a selftest. Written atomically (a crash leaves the old report
    or the new one, never a part); OutputError (field 'report') when it cannot be."""
    report = Report(run=run_info, summaries=summarize(results), results=list(results), performance=races(results),
                    selftest=selftest)
    return atomic_write(Path(path), json.dumps(report.to_json(), indent=1) + "\n", "report")


def render_reach(results: list[CaseResult], plan: EnvelopePlan | None = None) -> str:
    """How far each backend went: cases run and skipped, the longest context, the largest cache and
    batch, the edge families reached, then what the plan left out and why. '' when nothing ran."""
    names = list(dict.fromkeys([r.backend for r in results] + list(plan.idle if plan else ())))
    if not names:
        return ""
    lines = [f"{'reach':<28} {'run':>5} {'skip':>5} {'longest':>8} {'pool':>14} {'B':>5}  families"]
    lines += [_reach_line(name, [r for r in results if r.backend == name]) for name in names]
    return "\n".join(lines + _left_out(names, results, plan))


def _reach_line(name: str, results: list[CaseResult]) -> str:
    ran = [r for r in results if r.verdict != Verdict.SKIP and r.reach is not None]
    families = sorted({f for r in ran for f in r.reach.families})  # type: ignore[union-attr]
    longest = max((r.reach.longest for r in ran), default=0)  # type: ignore[union-attr]
    pool = max((r.reach.pool_bytes for r in ran), default=0)  # type: ignore[union-attr]
    batch = max((r.reach.batch for r in ran), default=0)  # type: ignore[union-attr]
    skipped = sum(r.verdict == Verdict.SKIP for r in results)
    return (f"{name:<28} {len(ran):>5} {skipped:>5} {longest:>8} {_bytes(pool):>14} {batch:>5}  "
            f"{len(families)}: {', '.join(families) or '-'}")


def _left_out(names: list[str], results: list[CaseResult], plan: EnvelopePlan | None) -> list[str]:
    """One line per backend that ran nothing (why) and per family its plan left out (the first reason)."""
    lines = []
    for name in names:
        if plan and name in plan.idle:
            lines.append(f"  {name}: runs nothing here: {plan.idle[name]}")
            continue
        reached = {f for r in results if r.backend == name and r.verdict != Verdict.SKIP and r.reach
                   for f in r.reach.families}  # a SKIP's families (a case not drawn, say) were not reached
        left = {}
        for family, reason in (plan.omitted.get(name, []) if plan else []):
            if family not in reached:
                left.setdefault(family, reason)
        lines += [f"  {name}: {family} left out: {reason}" for family, reason in sorted(left.items())]
    return lines


def _bytes(n: int) -> str:
    """Binary units, with digits enough to tell a cache just past 2^31 bytes from one just under."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.8g} {unit}"
    return f"{n} B"
