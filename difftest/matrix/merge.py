"""`difftest matrix merge`: the reports of a matrix's cells as one report, and what changed.

Every result of every cell becomes an Entry keyed by (device kind, version, backend, case). A
failure a ledger names is known (its reason and issue kept); with a baseline (an earlier merged.json)
the entries are diffed: new failures, fixed ones, and failures whose verdict or row counts changed.
What gates CI is the new failures alone: failures neither known nor already failing in the baseline
(without a baseline, every failure that is not known).

The outputs: merged.json (the baseline of the next merge), junit.xml (one testsuite per cell),
summary.md (for a CI step summary, its text from the reports escaped), heatmap.png
(difftest.matrix.heatmap) and index.html, one page with the picture embedded.

Every step is one pass over the results (or a dict lookup per result): a 20-minute fuzz cell makes
hundreds of thousands (bench/matrix_merge.py measures it against the quadratic merge it replaced).
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from difftest import __version__
from difftest.core.errors import SpecError, require
from difftest.core.files import atomic_write
from difftest.core.hardware import DeviceKind
from difftest.core.kinds import ExitStatus
from difftest.core.schema import (
    MAX_ITEMS,
    MAX_NAME,
    Count,
    ListOf,
    Member,
    Name,
    Names,
    Record,
    Text,
    TupleOf,
    bound_text,
    one_line,
    parse_json,
    read_text,
    to_jsonable,
    validate,
)
from difftest.core.verdict import Verdict, worst
from difftest.engine.result import CaseResult
from difftest.matrix.heatmap import NO_FAMILY, heatmap, render_png
from difftest.matrix.outputs import output_file, output_folder
from difftest.records import junit
from difftest.records.ledger import Ledger
from difftest.records.report import Report
from difftest.records.score import SelftestScore

MAX_LISTED = 200  # failures listed per section of the summary and the page


@dataclasses.dataclass(frozen=True)
class Entry(Record):
    """One result of one cell, as the merged report (merged.json) keeps it."""

    what = "a JSON object of merged result fields"
    cell: Name
    device: Member(DeviceKind)
    version: Name
    library: Text(MAX_NAME)  # the version's wheel, 'path DIR' or 'installed'
    backend: Name
    case: Name
    # the edge families the case was drawn for
    families: TupleOf(Name, MAX_ITEMS, f"a list of names of at most {bound_text(MAX_NAME)} characters")
    verdict: Member(Verdict)
    rows: Count
    mask_rows: Count
    nan_rows: Count  # NaN or unwritten rows
    value_rows: Count
    known: Text() | None = None  # the ledger's "reason (issue)" of a known divergence
    # What the backend loaded under that version (its Contract.library, as the cell's result names it):
    # the distribution, its version and the file it came from. Merges before it have none.
    loaded: Text() = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What a baseline is matched on."""
        return (self.device.value, self.version, self.backend, self.case)

    @property
    def label(self) -> str:
        """The heatmap's row: 'backend @ version (device)'."""
        return f"{self.backend} @ {self.version} ({self.device.value})"

    def describe(self) -> str:
        """'cpu/installed/quick planted-block-boundary on edges-s0: FAIL(mask), 3/12 mask rows'."""
        return (f"{self.cell} {self.backend} on {self.case}: {self.verdict.value}, {self.mask_rows}/{self.rows} "
                f"mask rows, {self.nan_rows} NaN rows, {self.value_rows} value rows")


@dataclasses.dataclass(frozen=True)
class MergedFile(Record):
    """merged.json (`difftest matrix merge`): what a later merge diffs against as its baseline."""

    what = "a JSON object {difftest, cells, results}"
    difftest: Text(MAX_NAME)  # the version of difftest that merged it
    cells: Names
    results: ListOf(Entry, 1 << 30, "a list of merged results")


@dataclasses.dataclass(frozen=True)
class CellReport:
    """One cell's report: its name and its results (for the merged JUnit file), and its mutation score
    where the cell's suite also ran `difftest selftest` (the report's `selftest` section)."""

    cell: str
    results: tuple[CaseResult, ...]
    selftest: SelftestScore | None = None


@dataclasses.dataclass(frozen=True)
class Diff:
    """The merged entries against a baseline."""

    new: tuple[Entry, ...]  # failing now, not known, not failing in the baseline
    fixed: tuple[Entry, ...]  # failing in the baseline, passing now
    changed: tuple[tuple[Entry, Entry], ...]  # (baseline, now): failing in both, verdict or counts differ


@dataclasses.dataclass(frozen=True)
class Merged:
    """Every cell's results, and the diff against the baseline when there was one."""

    cells: tuple[CellReport, ...]
    entries: tuple[Entry, ...]
    diff: Diff | None = None
    ledger: Ledger | None = None

    @property
    def new_failures(self) -> tuple[Entry, ...]:
        """What gates CI: failures neither known nor already in the baseline."""
        if self.diff is not None:
            return self.diff.new
        return tuple(e for e in self.entries if e.verdict.failed and e.known is None)

    @property
    def status(self) -> ExitStatus:
        """FAILED when there are new failures, else OK."""
        return ExitStatus.FAILED if self.new_failures else ExitStatus.OK


# --------------------------------------------------------------------------- reading and merging

def merge(reports: Sequence[str | Path], ledger: Ledger | None = None, baseline: str | Path | None = None) -> Merged:
    """The reports `difftest matrix run` wrote, merged; diffed against `baseline` (a merged.json)."""
    require(bool(reports), "reports", list(reports), "at least one report of `difftest matrix run`")
    cells, entries = [], []
    for path in reports:
        cell, made = _cell_entries(Path(path), ledger)
        cells.append(cell)
        entries += made
    twice = sorted(name for name, count in Counter(cell.cell for cell in cells).items() if count > 1)
    require(not twice, "reports", twice, "one report per cell (these cells have several)")
    diff = _diff(tuple(entries), load_merged(baseline)) if baseline is not None else None
    return Merged(tuple(cells), tuple(entries), diff, ledger)


def _cell_entries(path: Path, ledger: Ledger | None) -> tuple[CellReport, list[Entry]]:
    report = _parse_report(path)
    matrix = report.run.get("matrix")
    require(matrix is not None, f"{path} run.matrix", None, "a report of `difftest matrix run` (it names its cell)")
    results = tuple(report.results)
    entries = [_entry(matrix, result, ledger) for result in results]
    return CellReport(matrix["cell"], results, report.selftest), entries


def _parse_report(path: Path) -> Report:
    """A JSON report, validated into its Report; SpecError naming the field otherwise."""
    text = read_text(path, "reports", "JSON report")
    try:
        document = parse_json(text)
    except ValueError as exc:
        raise SpecError("reports", str(path), f"a JSON report ({exc})") from None
    return validate(Report, document, f"{path} ")


def _entry(matrix: dict, result: CaseResult, ledger: Ledger | None) -> Entry:
    c = result.comparison
    return Entry(
        cell=matrix["cell"], device=DeviceKind(matrix["device"]), version=matrix["version"],
        library=matrix["library"], backend=result.backend, case=result.case, families=_families(result),
        verdict=result.verdict, rows=c.rows if c else 0, mask_rows=len(c.mask_rows) if c else 0,
        nan_rows=len(c.nan_rows) + len(c.unwritten_rows) if c else 0, value_rows=len(c.value_rows) if c else 0,
        known=ledger.known(result) if ledger is not None else None, loaded=result.library)


def _families(result: CaseResult) -> tuple[str, ...]:
    """The edge families of the case; a fixed-suite case has none, and goes under its spec's name."""
    if result.reach is not None and result.reach.families:
        return tuple(result.reach.families)
    name = (result.spec or {}).get("name")
    return (str(name),) if name else (NO_FAMILY,)


def load_merged(path: str | Path) -> tuple[Entry, ...]:
    """The entries of a merged.json (MergedFile); SpecError naming the field that does not fit."""
    text = read_text(path, "baseline", "merged report (merged.json)")
    try:
        document = parse_json(text)
    except ValueError as exc:
        raise SpecError("baseline", str(path), f"a merged.json ({exc})") from None
    return tuple(validate(MergedFile, document, f"{path} ").results)


def _diff(now: tuple[Entry, ...], before: tuple[Entry, ...]) -> Diff:
    earlier = {e.key: e for e in before}
    new, fixed, changed = [], [], []
    for entry in now:
        old = earlier.get(entry.key)
        was_failing = old is not None and old.verdict.failed
        if entry.verdict.failed and entry.known is None and not was_failing:
            new.append(entry)
        elif was_failing and entry.verdict == Verdict.PASS:
            fixed.append(entry)
        elif was_failing and entry.verdict.failed and _counts(old) != _counts(entry):  # type: ignore[arg-type]
            changed.append((old, entry))
    return Diff(tuple(new), tuple(fixed), tuple(changed))  # type: ignore[arg-type]


def _counts(entry: Entry) -> tuple[Verdict, int, int, int, int]:
    return (entry.verdict, entry.rows, entry.mask_rows, entry.nan_rows, entry.value_rows)


# --------------------------------------------------------------------------- outputs

def write_outputs(merged: Merged, out: str | Path) -> list[Path]:
    """merged.json, junit.xml, heatmap.png, summary.md and index.html under the folder `out`
    (difftest.matrix.outputs says what it takes); OutputError naming `out` where one cannot be written."""
    folder = output_folder(out, "out")
    png = render_png(heatmap(merged.entries))
    document = to_jsonable(MergedFile(__version__, [cell.cell for cell in merged.cells], list(merged.entries)))
    known = merged.ledger.known if merged.ledger is not None else None
    suites = [junit.suite(cell.cell, cell.results, known) for cell in merged.cells]

    def path(name: str) -> Path:
        return output_file(folder / name, "out")

    return [atomic_write(path("merged.json"), json.dumps(document, indent=1) + "\n", "out"),
            junit.write(path("junit.xml"), suites, "difftest matrix", field="out"),
            atomic_write(path("heatmap.png"), png, "out"),
            atomic_write(path("summary.md"), render_markdown(merged), "out"),
            atomic_write(path("index.html"), render_html(merged, png), "out")]


def _table(entries: tuple[Entry, ...]) -> list[list[str]]:
    """One row per backend @ version on a device: cases run, the row counts, the worst verdict, and
    what the backend loaded there."""
    header = ["backend @ version (device)", "cases", "-inf-mask mismatch", "NaN rows", "value rows", "verdict",
              "library loaded"]
    by_label: dict[str, list[Entry]] = {}
    for e in entries:
        by_label.setdefault(e.label, []).append(e)
    return [header] + [_row(label, mine) for label, mine in by_label.items()]


def _row(label: str, entries: list[Entry]) -> list[str]:
    """The table's row of one backend @ version (device); what it loaded '; '-joined where its results
    name several (cells of two suites run at different times), '-' where they name none."""
    mine = [e for e in entries if e.verdict != Verdict.SKIP]
    verdict = worst([e.verdict for e in mine]).value if mine else Verdict.SKIP.value
    known = sum(e.known is not None for e in mine)
    loaded = "; ".join(dict.fromkeys(e.loaded for e in entries if e.loaded)) or "-"
    return [label, str(len(mine)), f"{sum(e.mask_rows for e in mine)}/{sum(e.rows for e in mine)}",
            str(sum(e.nan_rows for e in mine)), str(sum(e.value_rows for e in mine)),
            verdict + (f" ({known} known)" if known else ""), loaded]


def _sections(merged: Merged) -> list[tuple[str, list[str]]]:
    """(title, lines) of what the summary lists after its table."""
    diff = merged.diff
    sections = [("New failures (these fail the merge)", [e.describe() for e in merged.new_failures]),
                ("Known divergences (ledgered)", [f"{e.describe()}: {e.known}" for e in merged.entries
                                                  if e.verdict.failed and e.known])]
    scored = [cell for cell in merged.cells if cell.selftest is not None]
    if scored:
        lines = [line for cell in scored for line in _score_lines(cell)]
        sections.append(("Mutation scores (difftest selftest)", lines))
    if diff is not None:
        sections += [("Fixed since the baseline", [e.describe() for e in diff.fixed]),
                     ("Changed since the baseline", [f"{new.describe()} (was {old.verdict.value}, {old.mask_rows}/"
                                                     f"{old.rows} mask rows)" for old, new in diff.changed])]
    return sections


def _score_lines(cell: CellReport) -> list[str]:
    """A cell's mutation score, then each mutant that did not do what was expected, and why."""
    assert cell.selftest is not None, "only a cell with a score has its lines"
    off = [m for m in cell.selftest.mutants if not m.ok]
    return [f"{cell.cell}: {cell.selftest.summary}"] + [
        f"{cell.cell} {m.mutant}: {m.status.value}, expected {m.expected}: {m.why}" for m in off]


def _headline(merged: Merged) -> str:
    new = len(merged.new_failures)
    failing = sum(e.verdict.failed for e in merged.entries)
    gate = f"{new} new failures: the merge fails" if new else "no new failures"
    against = " against the baseline" if merged.diff is not None else ""
    return (f"{len(merged.cells)} cells, {len(merged.entries)} results, {failing} failing; {gate}{against}")


# ASCII punctuation that means something inside a line of GitHub-flavoured Markdown (code, emphasis,
# links and images, HTML, table cells, strike-through, entities, math); CommonMark lets any of it be
# backslash-escaped. A '#' mid-line is plain text, and stays so that 'owner/repo#12' still links.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~&$])")


def markdown_text(text: str) -> str:
    """`text` from a report as Markdown shows it literally: its control characters (a terminal escape,
    a newline that would end a table row) as Python escapes, then Markdown's punctuation escaped."""
    return _MARKDOWN.sub(r"\\\1", one_line(text))


def render_markdown(merged: Merged) -> str:
    """summary.md: the headline, the table, then new, known, fixed and changed failures. Names and
    reasons come from the cells' reports, so they are escaped (markdown_text)."""
    table = _table(merged.entries)
    lines = ["# difftest matrix", "", f"**{_headline(merged)}**", "", "| " + " | ".join(table[0]) + " |",
             "|" + "---|" * len(table[0])]
    lines += ["| " + " | ".join(markdown_text(value) for value in row) + " |" for row in table[1:]]
    for title, items in _sections(merged):
        lines += ["", f"## {title} ({len(items)})", ""] + [f"- {markdown_text(item)}" for item in _listed(items)]
    return "\n".join(lines) + "\n"


def _listed(items: list[str]) -> list[str]:
    """The first MAX_LISTED of `items` and a line saying how many more merged.json holds; 'none' for none.
    A GitHub step summary takes at most 1 MiB: a fuzz cell's failures listed one by one would not fit."""
    if not items:
        return ["none"]
    more = len(items) - MAX_LISTED
    return items[:MAX_LISTED] + ([f"... and {more} more (merged.json lists every result)"] if more > 0 else [])


def render_html(merged: Merged, png: bytes) -> str:
    """index.html: one self-contained page, the heatmap embedded as a data URL."""
    table = _table(merged.entries)
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in table[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in table[1:])
    parts = [f"<h1>difftest matrix</h1><p><b>{html.escape(_headline(merged))}</b></p>",
             f'<img alt="wrong rows per backend @ version and edge family" '
             f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">',
             f"<table><tr>{cells}</tr>{body}</table>"]
    for title, items in _sections(merged):
        listed = "".join(f"<li>{html.escape(item)}</li>" for item in _listed(items))
        parts.append(f"<h2>{html.escape(title)} ({len(items)})</h2><ul>{listed}</ul>")
    style = ("body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:2px 6px}"
             "table{border-collapse:collapse}")
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>difftest matrix</title><style>{style}</style>'
            f"</head><body>{''.join(parts)}</body></html>\n")


