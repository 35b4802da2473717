"""The values and row orders real top-k kernels meet, in fuzz as in run (issue 42): a top-k that never ranks
+inf is found by a CPU campaign (`fuzz --op topk`), a tie surplus stored into the next row by `run --op topk`'s
defaults (the envelope plan)."""

from __future__ import annotations

import pytest

from difftest.backends import torch_topk
from difftest.cli import main
from difftest.core.kinds import ExitStatus
from difftest.records.serialize import load_results
from tests.planted_topk_values import DropsPosInf, SpillsTies


@pytest.fixture
def planted(monkeypatch):
    for backend in (DropsPosInf, SpillsTies):
        monkeypatch.setitem(torch_topk.TOPK_BACKENDS, backend.name, backend)


def test_a_campaign_finds_a_top_k_that_drops_pos_inf(planted, tmp_path):
    """The random specs hold +inf (and NaN, and rows of all -inf) in about half the cases: the campaign stops at
    its first failure, long before its generous budget (it passed a whole 120-s campaign before)."""
    report = tmp_path / "fuzz.json"
    code = main(["fuzz", "--op", "topk", "--backends", DropsPosInf.name, "--budget", "10m", "--until-failures", "1",
                 "--report", str(report), "--quiet"])
    results = load_results(report, "report")
    failed = [r for r in results if r.verdict.failed]
    assert code == ExitStatus.FAILED and failed, [r.verdict for r in results]
    assert failed[0].selection is not None and failed[0].selection.wrong_rows


def test_run_defaults_catch_a_tie_surplus_stored_into_the_next_row(planted, tmp_path):
    report = tmp_path / "run.json"
    code = main(["run", "--op", "topk", "--backends", SpillsTies.name, "--report", str(report), "--quiet"])
    failed = {r.case: r.verdict for r in load_results(report, "report") if r.verdict.failed}
    assert code == ExitStatus.FAILED and "ties-across-rows-s0" in failed, sorted(failed)
