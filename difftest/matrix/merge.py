"""`difftest matrix merge`: the reports of a matrix's cells as one report, and what changed.

Every result of every cell becomes an Entry keyed by (device kind, version, backend, case). A
failure a ledger names is known (its reason and issue kept); with a baseline (an earlier merged.json)
the entries are diffed: new failures, fixed ones, and failures whose verdict or row counts changed.
What gates CI is the new failures alone: failures neither known nor already failing in the baseline
(without a baseline, every failure that is not known).

The outputs: merged.json (the baseline of the next merge), junit.xml (one testsuite per cell),
summary.md (for a CI step summary), heatmap.png (rows backend @ version, columns edge families,
coloured by -inf-mask mismatch rows, value and NaN failures marked) and index.html, one page with
the picture embedded.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path

from difftest import __version__
from difftest.core.errors import SpecError, require
from difftest.core.files import atomic_write
from difftest.core.hardware import DeviceKind
from difftest.core.kinds import ExitStatus
from difftest.core.schema import MergedModel, ReportModel, parse_json, read_text, validate
from difftest.core.verdict import Verdict, worst
from difftest.engine.result import CaseResult
from difftest.records import junit
from difftest.records.ledger import Ledger
from difftest.records.serialize import result_from_json, to_jsonable

NO_FAMILY = "(no family)"
_NOTHING_COMPARED = (Verdict.ERROR, Verdict.CRASH, Verdict.TIMEOUT)  # results with no rows judged


@dataclasses.dataclass(frozen=True)
class Entry:
    """One result of one cell, as the merged report keeps it."""

    cell: str
    device: DeviceKind
    version: str
    library: str  # the version's wheel, 'path DIR' or 'installed'
    backend: str
    case: str
    families: tuple[str, ...]  # the edge families the case was drawn for
    verdict: Verdict
    rows: int
    mask_rows: int
    nan_rows: int  # NaN or unwritten rows
    value_rows: int
    known: str | None = None  # the ledger's "reason (issue)" of a known divergence
    # What the backend loaded under that version (its Contract.library, as the cell's result names it):
    # the distribution, its version and the file it came from. Merges before it have none.
    loaded: str = ""

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
class CellReport:
    """One cell's report: its name and its results (for the merged JUnit file)."""

    cell: str
    results: tuple[CaseResult, ...]


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
    names = [cell.cell for cell in cells]
    twice = sorted({name for name in names if names.count(name) > 1})
    require(not twice, "reports", twice, "one report per cell (these cells have several)")
    diff = _diff(tuple(entries), load_merged(baseline)) if baseline is not None else None
    return Merged(tuple(cells), tuple(entries), diff, ledger)


def _cell_entries(path: Path, ledger: Ledger | None) -> tuple[CellReport, list[Entry]]:
    document = _parse_report(path)
    matrix = document["run"].get("matrix")
    require(matrix is not None, f"{path} run.matrix", None, "a report of `difftest matrix run` (it names its cell)")
    results = tuple(result_from_json(data) for data in document["results"])
    entries = [_entry(matrix, result, ledger) for result in results]
    return CellReport(matrix["cell"], results), entries


def _parse_report(path: Path) -> dict:
    """A JSON report, checked against difftest.core.schema.ReportModel; SpecError naming the field otherwise."""
    text = read_text(path, "reports", "JSON report")
    try:
        document = parse_json(text)
    except ValueError as exc:
        raise SpecError("reports", str(path), f"a JSON report ({exc})") from None
    validate(ReportModel, document, f"{path} ")
    return document


def _entry(matrix: dict, result: CaseResult, ledger: Ledger | None) -> Entry:
    c = result.comparison
    divergence = ledger.find(result) if ledger is not None and result.verdict.failed else None
    return Entry(
        cell=matrix["cell"], device=DeviceKind(matrix["device"]), version=matrix["version"],
        library=matrix["library"], backend=result.backend, case=result.case, families=_families(result),
        verdict=result.verdict, rows=c.rows if c else 0, mask_rows=len(c.mask_rows) if c else 0,
        nan_rows=len(c.nan_rows) + len(c.unwritten_rows) if c else 0, value_rows=len(c.value_rows) if c else 0,
        known=f"{divergence.reason} ({divergence.issue})" if divergence else None, loaded=result.library)


def _families(result: CaseResult) -> tuple[str, ...]:
    """The edge families of the case; a fixed-suite case has none, and goes under its spec's name."""
    if result.reach is not None and result.reach.families:
        return tuple(result.reach.families)
    name = (result.spec or {}).get("name")
    return (str(name),) if name else (NO_FAMILY,)


def load_merged(path: str | Path) -> tuple[Entry, ...]:
    """The entries of a merged.json, checked against difftest.core.schema.MergedModel."""
    text = read_text(path, "baseline", "merged report (merged.json)")
    try:
        document = parse_json(text)
    except ValueError as exc:
        raise SpecError("baseline", str(path), f"a merged.json ({exc})") from None
    model = validate(MergedModel, document, f"{path} ")
    return tuple(Entry(**{**e.model_dump(), "device": DeviceKind(e.device), "families": tuple(e.families),
                          "verdict": Verdict(e.verdict)}) for e in model.results)


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
    """merged.json, junit.xml, heatmap.png, summary.md and index.html under `out`."""
    out = Path(out)
    png = heatmap_png(merged.entries)
    document = {"difftest": __version__, "cells": [cell.cell for cell in merged.cells],
                "results": to_jsonable(list(merged.entries))}
    suites = [junit.suite(cell.cell, cell.results, _known(merged), field="out") for cell in merged.cells]
    return [atomic_write(out / "merged.json", json.dumps(document, indent=1) + "\n", "out"),
            junit.write(out / "junit.xml", suites, "difftest matrix", field="out"),
            atomic_write(out / "heatmap.png", png, "out"),
            atomic_write(out / "summary.md", render_markdown(merged), "out"),
            atomic_write(out / "index.html", render_html(merged, png), "out")]


def _known(merged: Merged) -> junit.Known:
    """The ledger's text of a failing result, for the JUnit file."""
    def known(result: CaseResult) -> str | None:
        divergence = merged.ledger.find(result) if merged.ledger is not None else None
        return f"{divergence.reason} ({divergence.issue})" if divergence else None

    return known


def _table(entries: tuple[Entry, ...]) -> list[list[str]]:
    """One row per backend @ version on a device: cases run, the row counts, the worst verdict, and
    what the backend loaded there."""
    header = ["backend @ version (device)", "cases", "-inf-mask mismatch", "NaN rows", "value rows", "verdict",
              "library loaded"]
    return [header] + [_row(label, [e for e in entries if e.label == label])
                       for label in dict.fromkeys(e.label for e in entries)]


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
    if diff is not None:
        sections += [("Fixed since the baseline", [e.describe() for e in diff.fixed]),
                     ("Changed since the baseline", [f"{new.describe()} (was {old.verdict.value}, {old.mask_rows}/"
                                                     f"{old.rows} mask rows)" for old, new in diff.changed])]
    return sections


def _headline(merged: Merged) -> str:
    new = len(merged.new_failures)
    failing = sum(e.verdict.failed for e in merged.entries)
    gate = f"{new} new failures: the merge fails" if new else "no new failures"
    against = " against the baseline" if merged.diff is not None else ""
    return (f"{len(merged.cells)} cells, {len(merged.entries)} results, {failing} failing; {gate}{against}")


def render_markdown(merged: Merged) -> str:
    """summary.md: the headline, the table, then new, known, fixed and changed failures."""
    table = _table(merged.entries)
    lines = ["# difftest matrix", "", f"**{_headline(merged)}**", "", "| " + " | ".join(table[0]) + " |",
             "|" + "---|" * len(table[0])]
    lines += ["| " + " | ".join(row) + " |" for row in table[1:]]
    for title, items in _sections(merged):
        lines += ["", f"## {title} ({len(items)})", ""] + [f"- {item}" for item in items or ["none"]]
    return "\n".join(lines) + "\n"


def render_html(merged: Merged, png: bytes) -> str:
    """index.html: one self-contained page, the heatmap embedded as a data URL."""
    table = _table(merged.entries)
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in table[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in table[1:])
    parts = [f"<h1>difftest matrix</h1><p><b>{html.escape(_headline(merged))}</b></p>",
             f'<img alt="-inf-mask mismatch rows per backend @ version and edge family" '
             f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">',
             f"<table><tr>{cells}</tr>{body}</table>"]
    for title, items in _sections(merged):
        listed = "".join(f"<li>{html.escape(item)}</li>" for item in items or ["none"])
        parts.append(f"<h2>{html.escape(title)} ({len(items)})</h2><ul>{listed}</ul>")
    style = ("body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:2px 6px}"
             "table{border-collapse:collapse}")
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>difftest matrix</title><style>{style}</style>'
            f"</head><body>{''.join(parts)}</body></html>\n")


# --------------------------------------------------------------------------- the heatmap

def heatmap_png(entries: tuple[Entry, ...]) -> bytes:
    """The heatmap as PNG bytes: rows backend @ version, columns edge families, colour the -inf-mask
    mismatch rows, 'x' where values were wrong, 'o' where NaN or unwritten, a diamond where a result
    compared nothing (ERROR, CRASH, TIMEOUT); grey where nothing ran."""
    import numpy as np  # deferred: with matplotlib, for the picture only
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # deferred: an optional dependency
    from matplotlib.figure import Figure  # deferred: as above (no pyplot: no global figure state)

    ran = [e for e in entries if e.verdict != Verdict.SKIP]
    rows = list(dict.fromkeys(e.label for e in ran)) or ["(nothing ran)"]
    columns = sorted({f for e in ran for f in e.families}) or [NO_FAMILY]
    grid = np.full((len(rows), len(columns)), np.nan)
    marks = heatmap_marks(ran, rows, columns)
    for e in ran:
        for family in e.families:
            r, c = rows.index(e.label), columns.index(family)
            grid[r, c] = (0 if math.isnan(grid[r, c]) else grid[r, c]) + e.mask_rows
    figure = Figure(figsize=(5 + 0.5 * len(columns), 2.5 + 0.4 * len(rows)), layout="constrained")
    FigureCanvasAgg(figure)
    _draw(figure, grid, rows, columns, marks)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})  # no version: same bytes each time
    return buffer.getvalue()


def heatmap_marks(ran: list[Entry], rows: list[str], columns: list[str]) -> dict[str, list[tuple[int, int]]]:
    """The (row, column) cells of each marker: 'x' wrong values, 'o' NaN or unwritten rows, 'D' a result
    with no rows compared (ERROR, CRASH, TIMEOUT), which its colour alone would show as 0."""
    marks: dict[str, list[tuple[int, int]]] = {"x": [], "o": [], "D": []}
    for e in ran:
        for family in e.families:
            cell = (rows.index(e.label), columns.index(family))
            for marker, present in (("x", e.value_rows), ("o", e.nan_rows), ("D", e.verdict in _NOTHING_COMPARED)):
                if present and cell not in marks[marker]:
                    marks[marker].append(cell)
    return marks


def _draw(figure: object, grid: object, rows: list[str], columns: list[str],
          marks: dict[str, list[tuple[int, int]]]) -> None:
    import numpy as np  # deferred: as in heatmap_png

    axes = figure.subplots()  # type: ignore[attr-defined]
    axes.set_facecolor("#dddddd")  # cells where nothing ran show through the masked values
    image = axes.imshow(np.ma.masked_invalid(grid), cmap="Reds", vmin=0, aspect="auto")
    figure.colorbar(image, ax=axes, label="-inf-mask mismatch rows")  # type: ignore[attr-defined]
    axes.set_xticks(range(len(columns)), columns, rotation=60, ha="right", fontsize=8)
    axes.set_yticks(range(len(rows)), rows, fontsize=8)
    for (r, c), value in np.ndenumerate(grid):
        if not np.isnan(value):
            axes.text(c, r, f"{value:g}", ha="center", va="center", fontsize=7, color="tab:blue")
    styles = {"x": {"c": "black"}, "o": {"facecolors": "none", "edgecolors": "black"},
              "D": {"facecolors": "none", "edgecolors": "tab:purple"}}
    for marker, label in (("x", "wrong values"), ("o", "NaN / unwritten"), ("D", "ERROR / CRASH / TIMEOUT")):
        if marks[marker]:
            ys, xs = zip(*marks[marker], strict=True)
            axes.scatter(xs, ys, marker=marker, s=30, label=label, **styles[marker])
    if any(marks.values()):
        axes.legend(loc="upper left", bbox_to_anchor=(0, -0.35), fontsize=7, frameon=False)
