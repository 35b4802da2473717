"""The merged matrix's heatmap: rows backend @ version (device), columns edge families.

A cell is every result of one row's backend on cases of one family. Its number is the rows those
results got wrong (each row counted once, under its worst symptom: a wrong -inf mask, NaN or unwritten
output, or wrong values), and its colour says the same on a scale of decades, so 140 wrong rows and
36,870 differ by two steps of colour instead of the first looking like 0 on a linear bar. Green is
a cell where nothing failed, and only that: a cell whose results failed without a wrong row to count
(an ERROR, CRASH or TIMEOUT compared none; a mutated input or a sanitizer report fails a case whose
rows may all be right) is purple. Marks in the cell's corners say which kinds of failure it holds.

`heatmap` computes all of it (numbers, colours, marks, the legend) as data; `render_png` only draws
it, with matplotlib (an optional dependency: difftest[matrix]).
"""

from __future__ import annotations

import dataclasses
import enum
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from difftest.core.schema import one_line
from difftest.core.verdict import Verdict

if TYPE_CHECKING:
    from difftest.matrix.merge import Entry

NO_FAMILY = "(no family)"
NOTHING_RAN = "(nothing ran)"
PASSED = "#1a9850"  # green: results ran and none failed
FAILED_UNCOUNTED = "#7b3294"  # purple: results failed, and no row of theirs was counted wrong
NOT_RUN = "#dddddd"  # grey: no result of this backend on this family
# The wrong-row scale, in decades: (lowest count, its legend, its colour), yellow to dark red.
SCALE = ((1, "1-9", "#fee08b"), (10, "10-99", "#fdae61"), (100, "100-999", "#f46d43"),
         (1_000, "1,000-9,999", "#d73027"), (10_000, "10,000-99,999", "#a50026"),
         (100_000, "100,000 or more", "#5e0016"))
DARK = {FAILED_UNCOUNTED, *(colour for low, _, colour in SCALE if low >= 1_000)}  # where the number is white
MAX_LABEL = 60  # characters of a row or column label drawn; a longer name is cut, with an ellipsis


class Mark(str, enum.Enum):
    """What a cell's corner marker says, beside its colour; the value is matplotlib's marker."""

    VALUES = "x"  # some rows had wrong values
    NAN = "o"  # some rows held NaN or were never written
    NOTHING_COMPARED = "D"  # some result compared no rows: ERROR, CRASH or TIMEOUT

    @property
    def label(self) -> str:
        """The legend's words for the mark."""
        return {Mark.VALUES: "wrong values", Mark.NAN: "NaN / unwritten rows",
                Mark.NOTHING_COMPARED: "ERROR / CRASH / TIMEOUT (no rows compared)"}[self]


NOTHING_COMPARED = (Verdict.ERROR, Verdict.CRASH, Verdict.TIMEOUT)


@dataclasses.dataclass
class HeatmapCell:
    """The results of one backend @ version on one family, summed."""

    results: int = 0
    failed: int = 0  # results with a failing verdict
    wrong_rows: int = 0
    marks: set[Mark] = dataclasses.field(default_factory=set)

    def add(self, entry: Entry) -> None:
        """Count one result in."""
        self.results += 1
        self.failed += entry.verdict.failed
        self.wrong_rows += entry.mask_rows + entry.nan_rows + entry.value_rows
        for mark, present in ((Mark.VALUES, entry.value_rows), (Mark.NAN, entry.nan_rows),
                              (Mark.NOTHING_COMPARED, entry.verdict in NOTHING_COMPARED)):
            if present:
                self.marks.add(mark)

    @property
    def colour(self) -> str:
        """Green when nothing failed, purple when results failed with no row counted wrong, else the
        scale's colour of the wrong rows."""
        if not self.failed:
            return PASSED
        if not self.wrong_rows:
            return FAILED_UNCOUNTED
        return next(colour for low, _, colour in reversed(SCALE) if self.wrong_rows >= low)

    @property
    def text(self) -> str:
        """The number drawn in the cell: its wrong rows."""
        return str(self.wrong_rows)


@dataclasses.dataclass(frozen=True)
class Heatmap:
    """What the picture shows, computed: labels, and the cell at each (row, column) that ran."""

    rows: tuple[str, ...]
    columns: tuple[str, ...]
    cells: dict[tuple[int, int], HeatmapCell]

    def colour(self, row: int, column: int) -> str:
        """The colour of a cell; grey where nothing ran."""
        cell = self.cells.get((row, column))
        return cell.colour if cell is not None else NOT_RUN

    def legend(self) -> list[tuple[str, str]]:
        """(colour, words) of every colour the picture can use, the wrong-row scale in order."""
        scale = [(colour, f"{words} wrong rows") for _, words, colour in SCALE]
        return [(PASSED, "0 wrong rows, nothing failed"), *scale,
                (FAILED_UNCOUNTED, "failed, no row counted wrong"), (NOT_RUN, "not run")]


def heatmap(entries: Sequence[Entry]) -> Heatmap:
    """The heatmap of `entries`, in one pass: SKIPs leave no mark (a backend that did not run has no
    row), rows in the order their backends first appear, columns sorted."""
    ran = [e for e in entries if e.verdict != Verdict.SKIP]
    rows = {label: i for i, label in enumerate(dict.fromkeys(e.label for e in ran))}
    columns = {family: i for i, family in enumerate(sorted({f for e in ran for f in e.families}))}
    cells: dict[tuple[int, int], HeatmapCell] = {}
    for e in ran:
        for family in e.families:
            cells.setdefault((rows[e.label], columns[family]), HeatmapCell()).add(e)
    return Heatmap(tuple(rows) or (NOTHING_RAN,), tuple(columns) or (NO_FAMILY,), cells)


def shown(label: str) -> str:
    """A label as drawn: control characters escaped (they have no glyph), at most MAX_LABEL characters."""
    label = one_line(label)
    return label if len(label) <= MAX_LABEL else label[:MAX_LABEL - 1] + "…"


# --------------------------------------------------------------------------- drawing

def render_png(picture: Heatmap) -> bytes:
    """`picture` as PNG bytes. No text is parsed as mathtext: a backend called `$x$` is drawn as typed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # deferred: an optional dependency
    from matplotlib.figure import Figure  # deferred: as above (no pyplot: no global figure state)

    figure = Figure(figsize=_size(picture), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    _draw_cells(axes, picture)
    _draw_legend(figure, axes, picture)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})  # no version: same bytes each time
    return buffer.getvalue()


# Inches: a character of an 8-point label (DejaVu Sans averages about 0.6 em), a cell, the legend's
# width and height. The figure is sized from its labels so constrained layout never squeezes the cells.
CHAR, CELL_WIDTH, CELL_HEIGHT, LEGEND = 0.075, 0.55, 0.34, (3.4, 3.2)


def _size(picture: Heatmap) -> tuple[float, float]:
    """(width, height) in inches: the longest row label, the cells, and the legend beside them; the
    cells above the longest column label (drawn at 60 degrees) or the legend, whichever is taller."""
    row_label = CHAR * max(len(shown(r)) for r in picture.rows)
    column_label = CHAR * max(len(shown(c)) for c in picture.columns) * 0.87
    width = 0.6 + row_label + CELL_WIDTH * len(picture.columns) + LEGEND[0]
    return width, 0.6 + max(CELL_HEIGHT * len(picture.rows) + column_label, LEGEND[1])


def _draw_cells(axes: Any, picture: Heatmap) -> None:
    from matplotlib.colors import to_rgb  # deferred: as in render_png

    grid = [[to_rgb(picture.colour(r, c)) for c in range(len(picture.columns))] for r in range(len(picture.rows))]
    axes.imshow(grid, aspect="auto", interpolation="nearest")
    axes.set_xticks(range(len(picture.columns)), [shown(c) for c in picture.columns], rotation=60, ha="right",
                    fontsize=8, parse_math=False)
    axes.set_yticks(range(len(picture.rows)), [shown(r) for r in picture.rows], fontsize=8, parse_math=False)
    axes.set_xticks([x + 0.5 for x in range(len(picture.columns) - 1)], minor=True)
    axes.set_yticks([y + 0.5 for y in range(len(picture.rows) - 1)], minor=True)
    axes.grid(which="minor", color="white", linewidth=1)
    axes.tick_params(which="minor", length=0)
    for (r, c), cell in picture.cells.items():
        colour = "white" if cell.colour in DARK else "black"
        axes.text(c, r, cell.text, ha="center", va="center", fontsize=7, color=colour, parse_math=False)
    _draw_marks(axes, picture)


# Where each mark sits in its cell (a cell spans +-0.5 around its centre; y grows downwards).
CORNERS = {Mark.VALUES: (0.33, -0.28), Mark.NAN: (-0.33, -0.28), Mark.NOTHING_COMPARED: (0.33, 0.28)}
MARK_STYLE = {Mark.VALUES: {"c": "black"}, Mark.NAN: {"facecolors": "none", "edgecolors": "black"},
              Mark.NOTHING_COMPARED: {"facecolors": "white", "edgecolors": "black"}}


def _draw_marks(axes: Any, picture: Heatmap) -> None:
    for mark in Mark:
        where = [(c + CORNERS[mark][0], r + CORNERS[mark][1]) for (r, c), cell in picture.cells.items()
                 if mark in cell.marks]
        if where:
            xs, ys = zip(*where, strict=True)
            axes.scatter(xs, ys, marker=mark.value, s=14, linewidths=0.8, label=mark.label, **MARK_STYLE[mark])


def _draw_legend(figure: Any, axes: Any, picture: Heatmap) -> None:
    """One legend right of the picture, inside the figure (constrained layout makes room for it)."""
    from matplotlib.patches import Patch  # deferred: as in render_png

    patches = [Patch(facecolor=colour, edgecolor="#888888", label=words) for colour, words in picture.legend()]
    marks, _ = axes.get_legend_handles_labels()
    figure.legend(handles=patches + marks, loc="outside right upper", fontsize=8, frameon=False,
                  title="wrong rows per cell (each row once)", title_fontsize=8)
