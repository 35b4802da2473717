"""`pytest --difftest-suite --difftest-op NAME`: another operation's suite as test items."""

from __future__ import annotations

import pytest

OP_SUITE = ["--difftest-suite", "--difftest-seed=7", "--difftest-op=topk"]


def test_the_topk_suite_runs_the_named_topk_backends(pytester: pytest.Pytester) -> None:
    collected = pytester.runpytest_inprocess("--co", "-q", *OP_SUITE, "--difftest-backends=torch-topk")
    collected.stdout.fnmatch_lines(["difftest::suite[[]torch-topk::*]"])
    result = pytester.runpytest_inprocess(*OP_SUITE, "--difftest-backends=torch-topk,torch-topk-vllm", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) > 0 and not outcomes.get("failed") and not outcomes.get("errors")


def test_an_operation_or_backend_it_does_not_have_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--difftest-suite", "--difftest-op=nonsense")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--difftest-op='nonsense': expected one of paged-logits*indexer*"])
    result = pytester.runpytest_inprocess(*OP_SUITE, "--difftest-backends=torch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--difftest-backends='torch': expected backends of the topk operation*"])
