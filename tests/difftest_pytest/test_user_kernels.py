"""Issue 40's "done when", the pytest part: a user top-k kernel, a user ragged kernel and a composition of them,
written in a folder outside the package, each with a planted bug caught through the plugin (`--difftest-op X
--difftest-backends my_kernels:obj`, the fixtures and the suite) and through `difftest.check` (under hypothesis,
its cases drawn inside the kernel's contract), while the right version passes; and `--difftest-cases envelope`
planning each backend's cases inside its own contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

KERNELS = Path(__file__).with_name("operation_kernels.py").read_text()
FIXTURE_TEST = """
import difftest

def test_kernel(difftest_backend, difftest_case):
    difftest.check(difftest_backend, difftest_case)
"""
PREFILL = "my_kernels:my_ragged+my_kernels:{topk}"


@pytest.fixture
def kernels(pytester: pytest.Pytester) -> pytest.Pytester:
    """pytester whose folder holds my_kernels.py (operation_kernels.py as a user would write it), importable."""
    pytester.makepyfile(my_kernels=KERNELS)
    pytester.syspathinsert()
    return pytester


@pytest.mark.parametrize(("op", "right", "planted", "verdict"), [
    ("topk", "my_kernels:my_topk", "my_kernels:my_topk_drops_largest", "FAIL(missing)"),
    ("ragged-logits", "my_kernels:my_ragged", "my_kernels:my_ragged_one_short", "FAIL(mask)"),
    ("prefill-indexer", PREFILL.format(topk="my_topk"), PREFILL.format(topk="my_topk_drops_largest"),
     "FAIL(missing)"),
    ("indexer", "torch+my_kernels:my_topk", "torch+my_kernels:my_topk_drops_largest", "FAIL(missing)"),
], ids=["topk", "ragged", "prefill-composition", "indexer-composition"])
def test_the_fixtures_catch_each_planted_bug_and_pass_the_right_kernel(kernels: pytest.Pytester, op: str,
                                                                       right: str, planted: str,
                                                                       verdict: str) -> None:
    kernels.makepyfile(FIXTURE_TEST)
    result = kernels.runpytest_inprocess("-p", "no:cacheprovider", f"--difftest-op={op}", "--difftest-seed=3",
                                         f"--difftest-backends={right},{planted}", "--difftest-report=report.json")
    report = json.loads((kernels.path / "report.json").read_text())
    verdicts: dict[str, set[str]] = {}
    for item in report["results"]:
        verdicts.setdefault(item["backend"], set()).add(item["verdict"])
    right_name, planted_name = (name for name in verdicts)  # in --difftest-backends' order
    assert verdicts[right_name] == {"PASS"}, verdicts
    assert verdict in verdicts[planted_name], verdicts
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] > 0 and outcomes["failed"] > 0 and "errors" not in outcomes, outcomes
    result.stdout.fnmatch_lines([f"E  *AssertionError: {planted_name} on * {verdict} ({op})"])


def test_the_suite_catches_the_planted_ragged_kernel(kernels: pytest.Pytester) -> None:
    result = kernels.runpytest_inprocess("-p", "no:cacheprovider", "--difftest-suite", "--difftest-op=ragged-logits",
                                         "--difftest-seed=3", "--difftest-repro-dir=repro",
                                         "--difftest-backends=my_kernels:my_ragged,my_kernels:my_ragged_one_short")
    result.assert_outcomes(passed=3, failed=3)
    result.stdout.fnmatch_lines([
        "my-ragged-one-short on random-windows-s3 [[]rows=8 keys=256 *]: FAIL(mask) (ragged-logits)",
        "*replay: difftest replay *repro/my-ragged-one-short--random-windows-s3 --trust-bundle",
        "my-ragged-one-short: 24/24 rows with the wrong -inf mask",
        "FAILED difftest::suite[[]my-ragged-one-short::random-windows] - my-ragged-one-s*"], consecutive=False)
    assert sorted(p.name for p in (kernels.path / "repro").iterdir()) == [
        "my-ragged-one-short--random-full-s3", "my-ragged-one-short--random-staircase-s3",
        "my-ragged-one-short--random-windows-s3"]


HYPOTHESIS_TEST = """
from hypothesis import given, settings

import difftest
from difftest.generators.strategies import for_contract
from my_kernels import {names}


@settings(max_examples=25, derandomize=True, database=None, deadline=None)
@given(case=for_contract({kernel}.difftest_contract, max_rows=6, max_width=48, max_k=12))
def test_right(case):
    difftest.check({kernel}, case)


@settings(max_examples=25, derandomize=True, database=None, deadline=None)
@given(case=for_contract({planted}.difftest_contract, max_rows=6, max_width=48, max_k=12))
def test_planted(case):
    difftest.check({planted}, case)
"""


def test_check_under_hypothesis_draws_inside_the_contract_and_finds_the_planted_top_k(
        kernels: pytest.Pytester) -> None:
    kernels.makepyfile(HYPOTHESIS_TEST.format(names="my_topk, my_topk_drops_largest", kernel="my_topk",
                                              planted="my_topk_drops_largest"))
    result = kernels.runpytest_inprocess("-p", "no:cacheprovider", "-rfs")
    result.assert_outcomes(passed=1, failed=1)  # no example skipped: every drawn case is one the contract takes
    # shrunk to the smallest case the bug shows on: one row of two columns, k = 1
    result.stdout.fnmatch_lines(["case = TopkCase('hypothesis-s0', rows=1 width=2 k=1 windows=[[]0,2))",
                                 "E  *my-topk-drops-largest on hypothesis-s0 [[]rows=1 width=2 k=1 *: FAIL(missing) *",
                                 "FAILED test_*.py::test_planted*"], consecutive=False)


def test_the_envelope_plans_each_backend_inside_its_own_contract(kernels: pytest.Pytester) -> None:
    kernels.makepyfile(FIXTURE_TEST)
    result = kernels.runpytest_inprocess("--co", "-q", "-p", "no:cacheprovider", "--difftest-op=topk",
                                         "--difftest-cases=envelope",
                                         "--difftest-backends=my_kernels:my_topk,torch-topk-vllm")
    ids = [line.partition("[")[2].rstrip("]") for line in result.stdout.lines if "::test_kernel[" in line]
    mine = {i.removeprefix("my-topk-") for i in ids if i.startswith("my-topk-")}
    vllm = {i.removeprefix("torch-topk-vllm-") for i in ids if i.startswith("torch-topk-vllm-")}
    assert {"prefill-windows", "decode-mtp3", "odd-padded-stride"} <= mine, ids
    # torch-topk-vllm reads the decode rule (no window starts) over rows at least k wide: no prefill windows
    assert "decode-mtp3" in vllm and "prefill-windows" not in vllm, ids
    assert len(ids) == len(mine) + len(vllm)
