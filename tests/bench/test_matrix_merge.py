"""bench/matrix_merge.py: the synthetic cells it merges are valid cell reports of the size asked for,
and its table reads the rounds' medians."""

import importlib

from difftest.matrix import merge

bench = importlib.import_module("bench.matrix_merge")


def test_the_cells_hold_the_results_asked_for_one_in_five_failing(tmp_path):
    paths = bench.make_cells(10, 3, tmp_path)
    merged = merge.merge(paths)
    assert [cell.cell for cell in merged.cells] == ["cpu/v0/fuzz", "cpu/v1/fuzz", "cpu/v2/fuzz"]
    assert len(merged.entries) == 10 and len({(e.version, e.case) for e in merged.entries}) == 10
    assert sum(e.verdict.failed for e in merged.entries) == 2, [e.verdict for e in merged.entries]


def test_the_table_gives_medians_ratios_and_cost_per_thousand_results():
    rows = [{"results": 1000, "tree": tree, "round": r, "seconds": s, "cpu_seconds": s / 2}
            for tree, r, s in (("baseline", 1, 4.0), ("baseline", 2, 6.0), ("this", 1, 1.0), ("this", 2, 1.0))]
    rows.append({"results": 9000, "tree": "this", "round": 1, "seconds": 9.0, "cpu_seconds": 4.5})
    text = bench.table(rows, [1000, 9000], {"baseline": "abc", "this": "def"}, "python bench/matrix_merge.py")
    assert "| 1000 | 5.00 (2.50) | 1.00 (0.50) | 0.200x (0.200x) | 2.500 / 0.500 |" in text, text
    assert "| 9000 | not run | 9.00 (4.50) | - | - / 0.500 |" in text, text
