"""A failing hypothesis example under the plugin ends as a reproducer bundle like any other failure."""

from __future__ import annotations

import pytest

from difftest import cli
from difftest.core.kinds import ExitStatus
from difftest.core.verdict import Verdict
from difftest.records.bundle import load_bundle

TEST_FILE = '''
from hypothesis import given, settings

import difftest
from difftest.generators.strategies import cases

BOUNDS = dict(max_batch=3, max_next_n=2, heads=(4,), head_dims=(16,), block_sizes=(16,), max_model_len=48,
              max_padding=1, max_extra_columns=0)


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(cases(**BOUNDS))
def test_planted_kernel(case):
    difftest.check("tests.planted:block_boundary_off_by_one", case)
'''


def test_the_shrunk_hypothesis_example_is_a_replayable_bundle(pytester: pytest.Pytester, capsys) -> None:
    pytester.makepyfile(test_planted=TEST_FILE)
    repro = pytester.path / "repro"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", f"--difftest-repro-dir={repro}",
                                          "--difftest-backends=torch")
    result.assert_outcomes(failed=1)
    # Hypothesis re-runs the minimal example last: one sequence whose length is the block size.
    result.stdout.fnmatch_lines(["case = Case('hypothesis-s0', B=1 next_n=1 *L=[[]16[]])",
                                 "*replay: difftest replay *planted-block-boundary--hypothesis-s0 --trust-bundle"])
    bundles = sorted(repro.iterdir(), key=lambda p: p.stat().st_mtime)
    minimal = load_bundle(bundles[-1])
    assert minimal.case.seq_lens.tolist() == [16] and minimal.verdict == Verdict.FAIL_MASK, f"{minimal.info=}"
    capsys.readouterr()
    assert cli.main(["replay", str(bundles[-1]), "--trust-bundle"]) == ExitStatus.FAILED
    assert "FAIL(mask)" in capsys.readouterr().out
