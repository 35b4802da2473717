"""`pytest --difftest-suite --difftest-op NAME`: another operation's suite as test items."""

from __future__ import annotations

import json

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
    result.stderr.fnmatch_lines(["*--difftest-backends='torch': expected a backend of the topk operation: a "
                                 "registered name among [[]*'torch-topk'*]*"])


def test_isolated_items_share_one_worker_per_backend(pytester: pytest.Pytester) -> None:
    """On a GPU every item runs isolated: a worker per item would start a CUDA context and compile the kernel
    for each case. The suite's items share one worker per backend, started by its first call, stopped at the
    end. (Isolation forced on the CPU, and the workers counted, by a conftest in a pytest of its own.)"""
    pytester.makeconftest("""
import json
import pathlib

from difftest.engine import operation_run
from difftest.engine.config import RunConfig

made, stopped = [], []


class Counted(operation_run.OperationWorker):
    def __init__(self, *args, **kwargs):
        made.append(args[1].name)
        super().__init__(*args, **kwargs)

    def stop(self):
        stopped.append(True)
        super().stop()


operation_run.OperationWorker = Counted
RunConfig.isolated = property(lambda self: True)


def pytest_unconfigure(config):
    pathlib.Path("counts.json").write_text(json.dumps({"made": sorted(made), "stopped": len(stopped)}))
""")
    result = pytester.runpytest_subprocess(*OP_SUITE, "--difftest-backends=torch-topk,torch-topk-vllm", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 4 and not outcomes.get("failed") and not outcomes.get("errors")
    counts = json.loads((pytester.path / "counts.json").read_text())
    assert counts == {"made": ["torch-topk", "torch-topk-vllm"], "stopped": 2}
