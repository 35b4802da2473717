"""The merged heatmap as data (difftest.matrix.heatmap): its colours, numbers, marks and legend, not
its pixels; and that it draws whatever the names hold."""

from __future__ import annotations

from difftest.core.hardware import DeviceKind
from difftest.core.verdict import Verdict
from difftest.matrix.heatmap import FAILED_UNCOUNTED, NOT_RUN, PASSED, SCALE, Mark, heatmap, render_png
from difftest.matrix.merge import Entry

FAMILIES = ("heads", "next-n", "random")


def _entry(backend: str, family: str, verdict: Verdict = Verdict.PASS, mask_rows: int = 0, nan_rows: int = 0,
           value_rows: int = 0, version: str = "v") -> Entry:
    compared = verdict not in (Verdict.ERROR, Verdict.CRASH, Verdict.TIMEOUT)
    return Entry(cell=f"sm90/{version}/quick", device=DeviceKind.SM90, version=version, library="installed",
                 backend=backend, case=f"{family}-s0", families=(family,), verdict=verdict,
                 rows=40_000 if compared else 0, mask_rows=mask_rows, nan_rows=nan_rows, value_rows=value_rows)


def test_an_all_pass_matrix_is_green_with_a_zero_in_every_cell():
    picture = heatmap([_entry(backend, family) for backend in ("a", "b") for family in FAMILIES])
    assert picture.rows == ("a @ v (sm90)", "b @ v (sm90)") and picture.columns == FAMILIES, picture
    colours = {picture.colour(r, c) for r in range(2) for c in range(3)}
    assert colours == {PASSED}, colours
    assert [cell.text for cell in picture.cells.values()] == ["0"] * 6
    assert not any(cell.marks for cell in picture.cells.values())
    assert picture.legend()[0] == (PASSED, "0 wrong rows, nothing failed"), picture.legend()


def test_the_scale_is_in_decades_so_hundreds_stand_apart_from_zero_and_from_tens_of_thousands():
    counts = {"heads": 140, "next-n": 383, "random": 36_870}
    picture = heatmap([_entry("k", family, Verdict.FAIL_MASK, mask_rows=n) for family, n in counts.items()] +
                      [_entry("k", "values", Verdict.FAIL_VALUE, value_rows=3)])
    colours = [picture.colour(0, c) for c in range(len(picture.columns))]
    scale = {words: colour for _, words, colour in SCALE}
    assert colours == [scale["100-999"], scale["100-999"], scale["10,000-99,999"], scale["1-9"]], colours
    assert [picture.cells[(0, c)].text for c in range(4)] == ["140", "383", "36870", "3"]
    assert PASSED not in colours and NOT_RUN not in colours


def test_a_failure_with_no_row_counted_is_never_green_and_nothing_run_is_grey():
    picture = heatmap([_entry("k", "heads", Verdict.ERROR), _entry("k", "next-n", Verdict.FAIL_MUTATED_INPUT),
                       _entry("j", "random", nan_rows=0), _entry("j", "heads", Verdict.SKIP)])
    assert picture.colour(0, 0) == FAILED_UNCOUNTED and picture.cells[(0, 0)].marks == {Mark.NOTHING_COMPARED}
    assert picture.colour(0, 1) == FAILED_UNCOUNTED and picture.cells[(0, 1)].marks == set()
    assert picture.colour(1, 2) == PASSED
    assert picture.colour(1, 0) == NOT_RUN and (1, 0) not in picture.cells, "a SKIP is not a run"


def test_each_row_counts_once_under_its_symptom_and_marks_say_which():
    cell = heatmap([_entry("k", "heads", Verdict.FAIL_NAN, mask_rows=2, nan_rows=3, value_rows=4),
                    _entry("k", "heads", Verdict.CRASH)]).cells[(0, 0)]
    assert (cell.results, cell.failed, cell.wrong_rows) == (2, 2, 9), cell
    assert cell.marks == {Mark.VALUES, Mark.NAN, Mark.NOTHING_COMPARED}, cell.marks


def test_names_are_drawn_as_typed_even_with_mathtext_and_long_ones_are_cut():
    png = render_png(heatmap([_entry("$\\frac{$", "$x^{$", Verdict.FAIL_MASK, mask_rows=1, version="a" * 400)]))
    assert png.startswith(b"\x89PNG")
