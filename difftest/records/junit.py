"""JUnit XML of results, for CI systems that show test results: one testcase per (backend, case).

A testcase's classname is the backend and its name the case. A failing result is a <failure> (an
ERROR, CRASH or TIMEOUT an <error>) whose message says what failed in one line, in the result's own words
(an error's exception; another operation's headline, 'FAIL(out-of-window): planted-whole-row-topk on
topk-...: 3/16 rows select a wrong set (41 tokens); ...'), and whose text is what `difftest run` prints for
it: its row of the table and its failure block (difftest.records.report), for paged logits and every other
operation alike. A SKIP is <skipped> with its reason; so is a known divergence (a failure a ledger names),
with the ledger's reason and issue, as pytest writes an xfail.

The XML is made with the standard library (xml.etree), so `difftest run --junit` needs no extra.
Each element is built once and the counts are summed as the testcases are made: a suite of n results
costs O(n). Characters XML 1.0 cannot carry (control characters from a backend's message or a case
name) are written as `\\xNN` escapes, so the file always parses.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path

from difftest.core.files import atomic_write
from difftest.core.verdict import Verdict
from difftest.engine.result import CaseResult
from difftest.records import report

# What a known divergence reads as: the ledger's "reason (issue)", or None for a result no entry names.
Known = Callable[[CaseResult], "str | None"]
ERRORS = (Verdict.ERROR, Verdict.CRASH, Verdict.TIMEOUT)  # the backend did not answer: not a wrong answer
COUNTS = ("tests", "failures", "errors", "skipped")
# What XML 1.0 does not allow in a document: C0 controls but tab, newline and carriage return; surrogates; FFFE/FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """`text` with every character XML 1.0 cannot hold written as a Python escape (`\\x1b`)."""
    return _NOT_XML.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"),
                        text)


def suite(name: str, results: Sequence[CaseResult], known: Known | None = None) -> ET.Element:
    """A <testsuite> called `name` with one testcase per result."""
    made = ET.Element("testsuite", name=xml_text(name))
    counts = dict.fromkeys(COUNTS, 0)
    seconds = 0.0
    for result in results:
        kind = _testcase(made, result, known(result) if known else None)
        counts["tests"] += 1
        if kind is not None:
            counts[kind] += 1
        seconds += result.seconds
    _set_counts(made, counts, seconds)
    return made


def _testcase(parent: ET.Element, result: CaseResult, known: str | None) -> str | None:
    """Append the testcase of `result` to `parent`; which count it adds to besides `tests` (None: a pass)."""
    case = ET.SubElement(parent, "testcase", name=xml_text(result.case), classname=xml_text(result.backend),
                         time=_seconds(result.seconds))
    if result.verdict == Verdict.SKIP:
        ET.SubElement(case, "skipped", type="SKIP", message=xml_text(result.reason or ""))
        return "skipped"
    if not result.verdict.failed:
        return None
    if known is not None:
        ET.SubElement(case, "skipped", type="xfail", message=xml_text(f"known divergence: {known}"))
        return "skipped"
    tag, count = ("error", "errors") if result.verdict in ERRORS else ("failure", "failures")
    said = _said(result)
    outcome = ET.SubElement(case, tag, type=result.verdict.value, message=xml_text(
        f"{result.verdict.value}: {result.backend} on {result.case}" + (f": {said}" if said else "")))
    outcome.text = xml_text(f"{report.render_table(report.summarize([result]))}\n\n{report.render_failures([result])}")
    return count


def _said(result: CaseResult) -> str:
    """A failing result in its own words, one line: an error's exception (its reason), else an operation's
    judgement (its headline) or what the result says of itself (a consensus verdict's peer); '' for a paged
    failure judged by the oracle, which its failure block below describes row by row."""
    text = result.reason if result.verdict in ERRORS else result.headline or result.reason
    return (text or "").partition("\n")[0]


def _seconds(seconds: float) -> str:
    return f"{seconds:.6g}"


def _set_counts(element: ET.Element, counts: dict[str, int], seconds: float) -> None:
    for key in COUNTS:
        element.set(key, str(counts[key]))
    element.set("time", _seconds(seconds))


def write(path: str | Path, suites: Sequence[ET.Element], name: str = "difftest", field: str = "junit") -> Path:
    """Write `suites` as one <testsuites> document, atomically; OutputError naming `field` when it cannot be."""
    document = ET.Element("testsuites", name=xml_text(name))
    totals = dict.fromkeys(COUNTS, 0)
    seconds = 0.0
    for one in suites:
        document.append(one)
        for key in COUNTS:
            totals[key] += int(one.get(key, "0"))
        seconds += float(one.get("time", "0"))
    _set_counts(document, totals, seconds)
    return atomic_write(Path(path), ET.tostring(document, encoding="utf-8", xml_declaration=True), field)
