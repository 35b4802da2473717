"""JUnit XML of results, for CI systems that show test results: one testcase per (backend, case).

A testcase's classname is the backend and its name the case. A failing result is a <failure> (an
ERROR, CRASH or TIMEOUT an <error>) whose text is what `difftest run` prints for it: its row of the
table and its failure block (difftest.records.report). A SKIP is <skipped> with its reason; so is a known
divergence (a failure a ledger names), with the ledger's reason and issue, as pytest writes an xfail.
The XML is made by junitparser.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from difftest.core.errors import SpecError
from difftest.core.files import atomic_write
from difftest.core.verdict import Verdict
from difftest.engine.result import CaseResult
from difftest.records import report

if TYPE_CHECKING:
    from junitparser import TestCase, TestSuite

# What a known divergence reads as: the ledger's "reason (issue)", or None for a result no entry names.
Known = Callable[[CaseResult], "str | None"]
ERRORS = (Verdict.ERROR, Verdict.CRASH, Verdict.TIMEOUT)  # the backend did not answer: not a wrong answer


def _junitparser(field: str) -> Any:
    try:
        import junitparser  # deferred: an optional dependency (difftest[matrix])
    except ModuleNotFoundError:
        raise SpecError(field, "junitparser", "junitparser installed (pip install 'difftest[matrix]')") from None
    return junitparser


def suite(name: str, results: Sequence[CaseResult], known: Known | None = None, field: str = "junit") -> TestSuite:
    """A <testsuite> called `name` with one testcase per result."""
    junitparser = _junitparser(field)
    made = junitparser.TestSuite(name)
    for result in results:
        made.add_testcase(_testcase(junitparser, result, known(result) if known else None))
    return made


def _testcase(junitparser: Any, result: CaseResult, known: str | None) -> TestCase:
    case = junitparser.TestCase(result.case, result.backend, result.seconds)
    if result.verdict == Verdict.SKIP:
        case.result = [junitparser.Skipped(result.reason or "", "SKIP")]
    elif result.verdict.failed and known is not None:
        case.result = [junitparser.Skipped(f"known divergence: {known}", "xfail")]
    elif result.verdict.failed:
        kind = junitparser.Error if result.verdict in ERRORS else junitparser.Failure
        outcome = kind(f"{result.verdict.value}: {result.backend} on {result.case}", result.verdict.value)
        outcome.text = f"{report.render_table(report.summarize([result]))}\n\n{report.render_failures([result])}"
        case.result = [outcome]
    return case


def write(path: str | Path, suites: Sequence[TestSuite], name: str = "difftest", field: str = "junit") -> Path:
    """Write `suites` as one <testsuites> document, atomically; OutputError naming `field` when it cannot be."""
    junitparser = _junitparser(field)
    document = junitparser.JUnitXml(name)
    for one in suites:
        document.add_testsuite(one)
    document.update_statistics()
    return atomic_write(Path(path), b'<?xml version="1.0" encoding="utf-8"?>\n' + document.tostring(), field)
