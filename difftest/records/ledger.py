"""Known divergences: which (backend, case) results are expected to fail, each entry citing its issue.

A ledger is a TOML file of `[[divergence]]` tables (docs/ledger.md):

    [[divergence]]
    backend = "aiter-triton-*"        # fnmatch pattern on the backend name
    case = "block-boundaries-*"       # optional: fnmatch pattern on the case name (default "*")
    verdict = "FAIL(mask)"            # optional: the failing verdict(s) expected (default: any failure)
    spec = { next_n = { min = 2 } }   # optional: spec fields the case must have: a value, an fnmatch
                                      # pattern (a string) or a range { min = A, max = B }
    strict = true                     # optional: a covered case that passes fails the run (default false)
    reason = "window end off by one when L % block_size == 0"
    issue = "ROCm/aiter#4244"         # required: a URL or owner/repo#N

An entry covers the results whose backend, case and spec it matches; it expects those among them
that fail with one of its verdicts. A failure no entry expects (a NaN where the entry says
FAIL(mask)) stays a failure: a new bug. A covered result that passes is an unexpected pass, which
fails the run only when its entry is strict. Python 3.10 reads TOML through the `tomli` package
(3.11+ has tomllib). Divergence is a [[divergence]] table's one definition: its fields are the table's
keys (`verdicts` is read from `verdict`), each bounded where it is declared.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, create_model

from difftest.core.errors import SpecError, require
from difftest.core.schema import (
    MAX_BATCH,
    MAX_MODEL_LEN,
    MAX_NAME,
    MAX_TEXT,
    Bool,
    Checked,
    Filled,
    ListOf,
    Model,
    Record,
    Rule,
    leaf,
    read_text,
    record_fields,
    validate,
)
from difftest.core.spec import CaseSpec
from difftest.core.verdict import Verdict
from difftest.engine.result import CaseResult

MAX_LEDGER_BYTES = 1 << 24
ISSUE = re.compile(r"https?://\S+|[\w.-]+/[\w.-]+#\d+")
ISSUE_TEXT = "the tracking issue: a URL (https://...) or 'owner/repo#N'"
RANGE_TEXT = "a range { min = A, max = B } (either may be left out)"
FAILING_VERDICTS = [v.value for v in Verdict if v.failed]


def _is_range(value: Any, bound: Callable[[Any], bool]) -> bool:
    """A range table { min = A, max = B }: one or both bounds, integers that pass `bound`, A <= B."""
    if type(value) is not dict or not value or not set(value) <= {"min", "max"}:
        return False
    ordered = "min" not in value or "max" not in value or value["min"] <= value["max"]
    return ordered and all(type(v) is int and bound(v) for v in value.values())


def _pattern_or(annotation: Any) -> Any:
    """A ledger spec value: an fnmatch pattern (a string), a value the CaseSpec field may take, or, for
    an integer field and for lengths, a range of them."""
    inner, python = leaf(annotation)
    if inner is None:  # lengths: a list of lengths, or a range one of the case's lengths must fall in
        def length(n: Any) -> bool:
            return type(n) is int and 0 <= n <= MAX_MODEL_LEN

        def check(value: Any) -> bool:
            return (type(value) is str and len(value) <= MAX_NAME) or _is_range(value, length) or (
                type(value) is list and len(value) <= MAX_BATCH and all(length(n) for n in value))

        return Rule(check, f"an fnmatch pattern (a string), a list of lengths, or {RANGE_TEXT}").type()
    if python is int:
        return Rule(lambda v: (type(v) is str and len(v) <= MAX_NAME) or inner.check(v) or _is_range(v, inner.check),
                    f"an fnmatch pattern (a string), {inner.expected}, or {RANGE_TEXT} of those").type()
    return Rule(lambda v: (type(v) is str and len(v) <= MAX_NAME) or inner.check(v),
                f"an fnmatch pattern (a string), or {inner.expected}").type()


class _LedgerSpecBase(Model):
    what: ClassVar[str] = "a table of CaseSpec fields, e.g. { next_n = 2 }"
    unknown_expected: ClassVar[str | None] = f"CaseSpec fields among {sorted(record_fields(CaseSpec))}"


# Each CaseSpec field, as a ledger entry may give it: an fnmatch pattern or a value of the field.
LedgerSpecModel: type[_LedgerSpecBase] = create_model(  # type: ignore[call-overload]
    "LedgerSpecModel", __base__=_LedgerSpecBase,
    **{name: (_pattern_or(annotation), None) for name, annotation in record_fields(CaseSpec).items()})


def _verdicts(value: Any) -> bool:
    values = value if type(value) is list else [value]
    return 0 < len(values) <= len(FAILING_VERDICTS) and all(type(v) is str and v in FAILING_VERDICTS for v in values)


def _verdict_set(value: str | list[str]) -> frozenset[Verdict]:
    return frozenset(Verdict(v) for v in ([value] if isinstance(value, str) else value))


def _spec_items(given: dict[str, Any], _: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(given.items()))


Verdicts = Rule(_verdicts, f"a failing verdict, or a list of them, among {FAILING_VERDICTS}",
                _verdict_set).type(frozenset)
Issue = Rule(lambda v: type(v) is str and len(v) <= MAX_NAME and ISSUE.fullmatch(v.strip()) is not None, ISSUE_TEXT,
             str.strip).type(str)
SpecPatterns = Checked(LedgerSpecModel, tuple[tuple[str, Any], ...], _spec_items)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Divergence(Record):
    """One known divergence: the results it covers, the verdicts it expects of them, why they fail, and
    where that is tracked."""

    what = "a [[divergence]] table"
    unknown_name = "keys"
    unknown_expected = "keys among ['backend', 'case', 'verdict', 'spec', 'strict', 'reason', 'issue']"
    backend: Filled("a backend name or fnmatch pattern")
    case: Filled("a case name or fnmatch pattern") = "*"
    # the failures it expects; empty: any failure
    verdicts: Annotated[Verdicts, Field(alias="verdict")] = frozenset()
    # (field, value, fnmatch pattern or {min, max}) the case's spec must have
    spec: SpecPatterns = ()
    strict: Bool = False  # a covered result that passes fails the run
    reason: Filled("a non-empty string", MAX_TEXT)
    issue: Issue  # stripped of surrounding blanks

    def covers(self, result: CaseResult) -> bool:
        """Whether `result` is one of this entry's (backend, case) pairs, whatever its verdict."""
        if not (fnmatch.fnmatchcase(result.backend, self.backend) and fnmatch.fnmatchcase(result.case, self.case)):
            return False
        if not self.spec:
            return True
        spec = result.spec or {}
        return all(field in spec and _field_matches(spec[field], want) for field, want in self.spec)

    def expects(self, result: CaseResult) -> bool:
        """Whether `result` is a failure this entry foresees: covered, and failing with one of its verdicts."""
        wanted = result.verdict in self.verdicts if self.verdicts else result.verdict.failed
        return wanted and self.covers(result)

    def describe(self) -> str:
        """'backend::case (issue)', with the verdicts it expects when it names them: how messages name the entry."""
        verdicts = f" {'|'.join(sorted(v.value for v in self.verdicts))}" if self.verdicts else ""
        return f"{self.backend}::{self.case}{verdicts} ({self.issue})"


@dataclasses.dataclass(frozen=True)
class Ledger:
    """Every entry of one ledger file, in file order."""

    path: Path
    entries: tuple[Divergence, ...]

    def find(self, result: CaseResult) -> Divergence | None:
        """For a failure, the first entry that expects it; for a pass, the first entry that covers it (an
        unexpected pass); else None."""
        if result.verdict.failed:
            return next((entry for entry in self.entries if entry.expects(result)), None)
        if result.verdict == Verdict.PASS:
            return next((entry for entry in self.entries if entry.covers(result)), None)
        return None

    def known(self, result: CaseResult) -> str | None:
        """'reason (issue)' of the entry that expects a failing `result` (how XFAIL lines and JUnit's
        skipped text read), else None."""
        entry = self.find(result) if result.verdict.failed else None
        return f"{entry.reason} ({entry.issue})" if entry else None

    def strict_pass(self, result: CaseResult) -> Divergence | None:
        """The strict entry a passing `result` shows wrong, or None."""
        entry = self.find(result) if result.verdict == Verdict.PASS else None
        return entry if entry is not None and entry.strict else None

    def unexpected(self, results: Iterable[CaseResult]) -> list[CaseResult]:
        """What fails a run under this ledger: failures no entry expects, and passes a strict entry covers."""
        return [r for r in results if (r.verdict.failed and self.find(r) is None) or self.strict_pass(r)]


def load_ledger(path: str | Path) -> Ledger:
    """Read and check a ledger file (LedgerModel, its tables Divergences); SpecError names the first field
    that is wrong ('divergence[2].issue')."""
    path = Path(path)
    require(path.is_file(), "ledger", str(path), "an existing TOML file")
    toml = _toml_module(path)
    text = read_text(path, "ledger", "TOML file", MAX_LEDGER_BYTES)
    try:
        document = toml.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError, or an integer past str()'s digits
        raise SpecError("ledger", str(path), f"valid TOML ({exc})") from None
    return Ledger(path, tuple(validate(LedgerModel, document, root="ledger").divergence))


class LedgerModel(Model):
    """A ledger file: [[divergence]] tables and nothing else."""

    what: ClassVar[str] = "a TOML document of [[divergence]] tables"
    unknown_name: ClassVar[str | None] = "tables"
    unknown_expected: ClassVar[str | None] = "only [[divergence]] tables"
    divergence: ListOf(Divergence, 1 << 16, "an array of tables ([[divergence]])") = Field(default_factory=list)


def _field_matches(value: Any, want: Any) -> bool:
    """A spec value against an entry's: a pattern, a range (for lengths: any of them in it), or equal."""
    if isinstance(want, str):
        return fnmatch.fnmatchcase(str(value), want)
    if isinstance(want, dict):
        values = value if isinstance(value, list) else [value]
        low, high = want.get("min", -math.inf), want.get("max", math.inf)
        return any(isinstance(v, int) and low <= v <= high for v in values)
    return value == want


def _toml_module(path: Path) -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise SpecError("ledger", str(path), "a TOML file, which Python 3.10 reads with tomli "
                            "(pip install tomli)") from None
    return tomllib


def render_ledger(ledger: Ledger, results: Iterable[CaseResult]) -> str:
    """What the ledger made of a run's results, one line each: XFAIL (a failure an entry expects), XPASS (a
    pass an entry covers) and XPASS(strict) (a pass a strict entry covers: it fails the run); '' for none."""
    lines = []
    for result in results:
        entry = ledger.find(result)
        if entry is None:
            continue
        if result.verdict.failed:
            lines.append(f"XFAIL {result.backend} on {result.case}: {result.verdict.value}, {ledger.known(result)}")
        elif entry.strict:
            lines.append(f"XPASS(strict) {result.backend} on {result.case}: ledger entry {entry.describe()} no "
                         f"longer diverges; remove it from {ledger.path}")
        else:
            lines.append(f"XPASS {result.backend} on {result.case}: passes although {entry.describe()} covers it")
    return f"ledger {ledger.path}:\n" + "\n".join(lines) if lines else ""
