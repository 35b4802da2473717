"""End to end, as CI runs it: plan -> run the CPU cell -> merge -> diff against a baseline.

The kernel under test is a module in a path version's folder (as a source checkout would be): the
"good" folder computes the formula, the "bad" one drops the last key of rows whose window ends on a
block boundary (tests.planted's bug). The same cell run from each folder gives a baseline and a
regression: the regression makes merge exit 1, a ledger entry for it makes merge exit 0.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from difftest.core.kinds import ExitStatus
from tests.support import run_cli

KERNEL = '''
import os

import torch

from difftest.backends.user import backend
from tests.planted import CONTRACT
from tests.user_backends import logits_with_limits

BROKEN = {broken}


@backend(contract=CONTRACT, name="kern")
def kernel(q, kv_cache, weights, context_lens, block_table, max_model_len):
    # A path version is first on PYTHONPATH while its cell runs, for every process the run starts.
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == os.path.dirname(os.path.abspath(__file__))
    lens = context_lens.to(torch.int64)
    if BROKEN:
        lens = torch.where((lens > 0) & (lens % kv_cache.shape[1] == 0), lens - 1, lens)
    return logits_with_limits(q, kv_cache, weights, lens, block_table, max_model_len)
'''
MATRIX = '''
[matrix]
backends = ["torch", "kern:kernel"]

[matrix.devices.cpu]
runner = "ubuntu-latest"

[matrix.versions.main]
path = "{folder}"

[matrix.suites.tiny.spec]
name = "tiny"
lengths = [0, 1, 16, 17]
next_n = 2
heads = 2
head_dim = 16
block_size = 16
max_model_len = 32
'''
CELL = "cpu/main/tiny"


def _run(tmp_path: Path, which: str) -> Path:
    """The cell run with the kernel of folder `which`; the path of its report."""
    folder = tmp_path / which
    folder.mkdir()
    (folder / "kern.py").write_text(KERNEL.format(broken=which == "bad"))
    matrix = tmp_path / f"{which}.toml"
    matrix.write_text(MATRIX.format(folder=which))
    sys.modules.pop("kern", None)  # the other folder's module, from the run before
    before = os.environ.get("PYTHONPATH")
    code, out, err = run_cli(["matrix", "run", CELL, "--file", str(matrix), "--out", str(tmp_path / f"out-{which}")])
    assert code == ExitStatus.OK, f"{code=}\n{out}\n{err}"
    assert os.environ.get("PYTHONPATH") == before and str(folder) not in sys.path, "the folder is taken off after"
    return tmp_path / f"out-{which}" / "report.json"


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    tmp_path = tmp_path_factory.mktemp("matrix")
    return {which: _run(tmp_path, which) for which in ("good", "bad")} | {"tmp": tmp_path}


def _merge(*argv: str) -> tuple[int, str]:
    code, out, err = run_cli(["matrix", "merge", *argv])
    assert code in (ExitStatus.OK, ExitStatus.FAILED), f"{code=}\n{out}\n{err}"
    return code, out


def test_the_plan_has_the_cpu_cell(reports):
    code, out, _ = run_cli(["matrix", "plan", "--file", str(reports["tmp"] / "good.toml")])
    assert code == ExitStatus.OK and "cpu/main/tiny" in out and "path good: torch, kern:kernel" in out, out


def test_a_cell_writes_its_report_and_junit(reports):
    report = json.loads(reports["bad"].read_text())
    assert report["run"]["matrix"] == {"cell": CELL, "device": "cpu", "version": "main", "library": "path bad",
                                       "suite": "tiny"}, report["run"]
    verdicts = {r["backend"]: r["verdict"] for r in report["results"]}
    assert verdicts == {"torch": "PASS", "kern": "FAIL(mask)"}, verdicts
    junit = ET.parse(reports["bad"].with_name("junit.xml")).getroot()
    assert (junit.get("tests"), junit.get("failures")) == ("2", "1"), ET.tostring(junit)


def test_a_regression_against_the_baseline_fails_the_merge(reports):
    tmp = reports["tmp"]
    assert _merge("--out", str(tmp / "base"), str(reports["good"]))[0] == ExitStatus.OK
    code, out = _merge("--out", str(tmp / "regressed"), "--baseline", str(tmp / "base" / "merged.json"),
                       str(reports["bad"]))
    assert code == ExitStatus.FAILED, out
    assert "## New failures (these fail the merge) (1)" in out and "cpu/main/tiny kern on tiny-s0: FAIL(mask), " \
        "2/8 mask rows" in out, out


def test_a_ledgered_divergence_does_not_fail_the_merge(reports):
    tmp = reports["tmp"]
    ledger = tmp / "ledger.toml"
    ledger.write_text('[[divergence]]\nbackend = "kern"\ncase = "tiny-*"\nreason = "planted"\nissue = "a/b#1"\n')
    code, out = _merge("--out", str(tmp / "known"), "--ledger", str(ledger), str(reports["bad"]))
    assert code == ExitStatus.OK, out
    assert "## Known divergences (ledgered) (1)" in out and "planted (a/b#1)" in out, out
    junit = ET.parse(tmp / "known" / "junit.xml").getroot()
    assert (junit.get("failures"), junit.get("skipped")) == ("0", "1"), ET.tostring(junit)
    assert junit.find("testsuite/testcase/skipped").get("type") == "xfail", ET.tostring(junit)


def test_a_fix_is_listed_and_the_outputs_are_whole(reports):
    tmp = reports["tmp"]
    _merge("--out", str(tmp / "was-bad"), str(reports["bad"]))
    code, out = _merge("--out", str(tmp / "fixed"), "--baseline", str(tmp / "was-bad" / "merged.json"),
                       str(reports["good"]))
    assert code == ExitStatus.OK and "## Fixed since the baseline (1)" in out, out
    folder = tmp / "fixed"
    png = (folder / "heatmap.png").read_bytes()
    assert png.startswith(b"\x89PNG"), png[:8]
    page = (folder / "index.html").read_text()
    assert f"data:image/png;base64,{base64.b64encode(png).decode()}" in page, "the picture is embedded"
    assert (folder / "summary.md").read_text().startswith("# difftest matrix\n")
    merged = json.loads((folder / "merged.json").read_text())
    assert merged["cells"] == [CELL] and len(merged["results"]) == 2, merged


def test_the_merge_names_what_each_backend_loaded(reports):
    """Each result's Contract.library reaches merged.json (`loaded`) and the summary's table."""
    out = reports["tmp"] / "loaded"
    _merge("--out", str(out), str(reports["good"]))
    merged = json.loads((out / "merged.json").read_text())
    loaded = {e["backend"]: e["loaded"] for e in merged["results"]}
    assert loaded == {"torch": f"torch {torch.__version__}", "kern": "tests.planted"}, loaded
    lines = (out / "summary.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| backend @ version"))
    assert header.endswith("| verdict | library loaded |"), header
    assert "| kern @ main (cpu) | 1 | 0/8 | 0 | 0 | PASS | tests.planted |" in lines, lines


def test_a_baseline_merged_before_the_loaded_field_still_diffs(reports):
    tmp = reports["tmp"]
    _merge("--out", str(tmp / "old-base"), str(reports["good"]))
    baseline = tmp / "old-base" / "merged.json"
    document = json.loads(baseline.read_text())
    for entry in document["results"]:
        del entry["loaded"]
    baseline.write_text(json.dumps(document))
    code, out = _merge("--out", str(tmp / "against-old"), "--baseline", str(baseline), str(reports["bad"]))
    assert code == ExitStatus.FAILED and "## New failures (these fail the merge) (1)" in out, out


def test_a_bad_baseline_is_one_line(reports, tmp_path):
    bad = tmp_path / "merged.json"
    bad.write_text('{"difftest": "0", "cells": [], "results": [{"cell": 1}]}')
    code, _, err = run_cli(["matrix", "merge", "--out", str(tmp_path / "o"), "--baseline", str(bad),
                            str(reports["good"])])
    assert code == ExitStatus.USAGE and err.count("\n") == 1 and "results[0]" in err, err


SCORED = '''
[matrix]
backends = ["torch"]

[matrix.devices.cpu]
runner = "ubuntu-latest"

[matrix.versions.installed]

[matrix.suites.scored]
case_filter = ["shorter-than-next-n-*"]
selftest = true
'''


def test_a_cell_that_scores_the_mutants_shows_its_score_in_the_summary(tmp_path):
    """selftest = true: the cell's report carries the mutants' score in the torch backend's envelope (their
    results stay out of the cell's), and the merged summary lists it."""
    matrix = tmp_path / "scored.toml"
    matrix.write_text(SCORED)
    code, out, err = run_cli(["matrix", "run", "cpu/installed/scored", "--file", str(matrix), "--out",
                              str(tmp_path / "cell")])
    assert code == ExitStatus.OK, f"{out}\n{err}"
    report = json.loads((tmp_path / "cell" / "report.json").read_text())
    assert {r["backend"] for r in report["results"]} == {"torch"}
    assert report["selftest"]["status"] == "OK" and report["selftest"]["template"] == "torch"
    code, out = _merge(str(tmp_path / "cell" / "report.json"), "--out", str(tmp_path / "merged"))
    summary = (tmp_path / "merged" / "summary.md").read_text()
    assert code == ExitStatus.OK and "## Mutation scores (difftest selftest) (1)" in summary
    assert f"- cpu/installed/scored: {report['selftest']['summary']}" in summary
