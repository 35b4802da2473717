import importlib
from pathlib import Path

import pytest

bench = importlib.import_module("bench.make_run_ab")

OUTPUT = """\
backend                      cases   rows  -inf-mask mismatch  max rel err  top-k overlap  verdict
torch                           38    361  0/361                         0          1.000  PASS
deepgemm                         0      0  -                             -              -  SKIP: CUDA only
aiter-triton-stage1             38    361  253/361                3.89e-07          0.683  FAIL(mask)

libraries loaded:
  torch                      torch 2.13.0+cpu
"""


def test_the_run_arguments_are_the_makefiles_own_with_the_report_moved(tmp_path):
    report = tmp_path / "r.json"
    ours = (Path(bench.ROOT) / "Makefile").read_text()
    assert bench.make_run_arguments(ours, report) == ["--isolate", "--report", str(report)]
    older = "run: $(BIN)/difftest\n\t$(BIN)/difftest run --report reports/cpu/default.json || test $$? -eq 1\n"
    assert bench.make_run_arguments(older, report) == ["--report", str(report)]


def test_a_makefile_without_the_recipe_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="difftest run"):
        bench.make_run_arguments("run:\n\tpython -m something\n", tmp_path / "r.json")


def test_the_summary_table_is_read_up_to_its_blank_line():
    table = bench.summary_table(OUTPUT)
    assert [row.backend for row in table] == ["torch", "deepgemm", "aiter-triton-stage1"]
    assert table[2] == bench.BackendRow("aiter-triton-stage1", 38, 361, "253/361")
    assert bench.summary_table("Traceback (most recent call last):\n") == []


def test_the_means_leave_out_the_warming_round():
    table = bench.summary_table(OUTPUT)
    timings = [bench.Timing("baseline", 1, 100.0, 1, table), bench.Timing("this", 1, 50.0, 1, table),
               bench.Timing("baseline", 2, 76.0, 1, table), bench.Timing("this", 2, 19.0, 1, table[:1])]
    summary = bench.summarize(timings, "old", "new")
    assert summary["ratio_seconds"] == pytest.approx(0.25)
    assert summary["ratio_seconds_per_case"] == pytest.approx(0.25)
    text = bench.markdown(timings, summary, "python bench/make_run_ab.py --baseline old")
    assert "0.25x the wall time" in text and text.startswith("`python bench/make_run_ab.py --baseline old`")
