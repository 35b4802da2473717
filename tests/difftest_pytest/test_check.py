"""difftest.workflows.checking: the CaseResult on PASS, the row table (another operation's headline) and one replay
line on failure, skips, for every operation; a backend of another operation is one line."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

import difftest
from difftest.core.case import Case
from difftest.core.errors import SpecError
from difftest.core.kinds import Isolation, OperationKind
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.result import CaseResult
from difftest.generators import CaseSpec, build_case
from difftest.generators.cases import edge_cases
from difftest.operations import operation
from difftest.records.bundle import load_bundle
from difftest.workflows.observe import Observer, observed
from tests import broken_backends
from tests.difftest_pytest import operation_kernels as kernels
from tests.difftest_pytest.planted_backends import CONTRACT, off_by_one

KERNELS = "tests.difftest_pytest.operation_kernels"
LENGTH_ONE = next(spec for spec in edge_cases() if spec.name == "length-one")  # L = [1, 1], next_n = 1


def check_unobserved(backend: object, case: Case) -> CaseResult:
    """difftest.workflows.checking with no observer: these checks fail on purpose, so they stay out of the bundles
    and the difftest summary of the run that tests them."""
    with observed(Observer()):
        return difftest.check(backend, case)  # type: ignore[arg-type]


def test_pass_returns_the_result() -> None:
    result = difftest.check("torch", build_case(LENGTH_ONE, 5))
    assert result.verdict == Verdict.PASS
    assert (result.backend, result.case, result.comparison.mask_rows) == ("torch", "length-one-s5", [])


def test_failure_is_the_row_table_with_a_run_line() -> None:
    with pytest.raises(AssertionError) as excinfo:
        check_unobserved(off_by_one, build_case(LENGTH_ONE, 5))
    lines = str(excinfo.value).splitlines()
    assert lines[0].startswith("off-by-one on length-one-s5 [B=2 next_n=1 ")
    assert lines[0].endswith(": FAIL(mask) (encoding per-row)")
    assert lines[1].startswith("    2/2 rows with the wrong -inf mask [0,1]; NaN rows none;")
    assert re.fullmatch(r"    first mismatch: row 0, position 0: expected \S+, got -inf \(FAIL\(mask\)\)", lines[2])
    replay = next(line for line in lines if line.startswith("    replay: "))
    assert lines[-1] == replay, "the replay line comes last"
    words = shlex.split(replay.removeprefix("    replay: "))
    assert words[:4] == ["difftest", "run", "--backends", "tests.difftest_pytest.planted_backends:off_by_one"]
    assert words[4] == "--spec" and words[6:] == ["--seed", "5", "--device", "cpu", "--oracle", "exact", "--no-isolate"]
    # The spec is what differs from CaseSpec's defaults: CaseSpec.from_json gives back the same spec.
    assert CaseSpec.from_json(json.loads(words[5])) == LENGTH_ONE


@pytest.mark.parametrize("isolate", [None, True], ids=["in-process", "isolated"])
def test_an_error_is_its_whole_traceback_with_a_run_line(isolate: bool | None) -> None:
    case = build_case(LENGTH_ONE, 5)
    with pytest.raises(AssertionError) as excinfo, observed(Observer()):
        difftest.check(broken_backends.raises_nested, case, RunConfig(isolate=isolate))
    message = str(excinfo.value)
    assert ": ERROR (encoding per-row)\n    RuntimeError: nested launch failed for 2 rows\n    traceback:\n" in message
    assert all(line in message for line in broken_backends.nested_traceback_lines()), message
    replay = "    replay: difftest run --backends tests.broken_backends:raises_nested"
    assert message.splitlines()[-1].startswith(replay), message


def test_check_runs_in_a_worker_only_when_asked() -> None:
    case = build_case(LENGTH_ONE, 5)
    assert difftest.check("torch", case, RunConfig(isolate=True)).isolation == Isolation.WORKER
    assert difftest.check("torch", case).isolation is None


def test_an_observer_hears_the_result_and_gets_a_bundle(tmp_path: Path) -> None:
    heard: list[CaseResult] = []
    with observed(Observer(on_result=heard.append, repro_dir=tmp_path)), pytest.raises(AssertionError) as excinfo:
        difftest.check(off_by_one, build_case(LENGTH_ONE, 5))
    folder = tmp_path / "off-by-one--length-one-s5"
    assert str(excinfo.value).splitlines()[-1] == f"    replay: difftest replay {folder} --trust-bundle"
    bundle = load_bundle(folder)
    assert (bundle.backend, bundle.origin.target, bundle.verdict) == (
        "off-by-one", "tests.difftest_pytest.planted_backends:off_by_one", Verdict.FAIL_MASK)
    assert [r.verdict for r in heard] == [Verdict.FAIL_MASK]


def test_a_case_without_a_spec_points_at_the_repro_dir() -> None:
    case = dataclasses.replace(build_case(LENGTH_ONE, 5), meta={})
    with pytest.raises(AssertionError, match=r"replay: none from the command line .*set a repro dir"):
        check_unobserved(off_by_one, case)


def test_a_case_the_backend_cannot_take_skips_the_test() -> None:
    @difftest.backend(dataclasses.replace(CONTRACT, next_n=(1,)), name="mtp1-only")
    def mtp1_only(*args: object) -> None:
        raise AssertionError("never called: the contract excludes the case")

    with pytest.raises(pytest.skip.Exception, match=r"mtp1-only cannot take .*: contract next_n \[1\] excludes 2"):
        check_unobserved(mtp1_only, build_case(LENGTH_ONE.replace(next_n=2), 5))


def test_an_unknown_backend_name_says_what_is_allowed() -> None:
    allowed = r"registered names among \[.*'torch'.*\], 'package.module:object', or"
    with pytest.raises(SpecError, match=rf"backend='nope': expected {allowed}"):
        difftest.check("nope", build_case(LENGTH_ONE, 5))


def first_case(kind: OperationKind, seed: int = 3) -> Any:
    """The first case of the operation's fixed suite."""
    op = operation(kind)
    return op.build(op.suite()[0], seed, "cpu")


@pytest.mark.parametrize(("kind", "backend"), [
    (OperationKind.TOPK, "torch-topk"), (OperationKind.TOPK, kernels.my_topk),
    (OperationKind.RAGGED_LOGITS, kernels.my_ragged), (OperationKind.INDEXER, "torch+torch-topk"),
    (OperationKind.PREFILL_INDEXER, f"{KERNELS}:my_ragged+torch-topk"),
], ids=["topk-name", "topk-function", "ragged-function", "indexer-name", "prefill-indexer-composition"])
def test_every_operation_passes_through_its_own_oracle(kind: OperationKind, backend: object) -> None:
    result = difftest.check(backend, first_case(kind))
    assert (result.verdict, result.operation) == (Verdict.PASS, kind)


@pytest.mark.parametrize(("kind", "backend", "headline"), [
    (OperationKind.TOPK, kernels.my_topk_drops_largest,
     r"my-topk-drops-largest on random-ragged-k512-s3 \[rows=4 .*\]: FAIL\(missing\) \(topk\)\n"
     r"    \d+/4 rows select a wrong set \(\d+ tokens\); first: row \d+ slot "),
    (OperationKind.RAGGED_LOGITS, kernels.my_ragged_one_short,
     r"my-ragged-one-short on random-windows-s3 \[rows=8 .*\]: FAIL\(mask\) \(ragged-logits\)\n"
     r"    8/8 rows with a wrong -inf mask"),
], ids=["topk", "ragged"])
def test_an_operation_failure_is_its_headline_and_a_bundle_that_replays(tmp_path: Path, kind: OperationKind,
                                                                       backend: object, headline: str) -> None:
    case = first_case(kind)
    with pytest.raises(AssertionError, match=r"replay: none from the command line \(difftest run --op .* draws no "
                                             r"single case\): set a repro dir"):
        check_unobserved(backend, case)
    with observed(Observer(repro_dir=tmp_path)), pytest.raises(AssertionError) as excinfo:
        difftest.check(backend, case)
    assert re.match(headline, str(excinfo.value)), str(excinfo.value)
    (folder,) = tmp_path.iterdir()
    assert str(excinfo.value).splitlines()[-1] == f"    replay: difftest replay {folder} --trust-bundle"
    bundle = load_bundle(folder)
    assert (bundle.origin.target, bundle.operation) == (f"{KERNELS}:{backend.__name__}", kind)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("backend", "case", "message"), [
    ("torch-topk", lambda: build_case(LENGTH_ONE, 5), r"backend='torch-topk': expected registered names among "
                                                      r"\[.*'torch'.*\]"),
    (off_by_one, lambda: first_case(OperationKind.TOPK), r"backend='off-by-one': expected a backend of the topk "
                                                         r"operation \(the case's\): its contract \(Contract\) is of "
                                                         r"the paged-logits operation"),
    (kernels.my_topk, lambda: first_case(OperationKind.RAGGED_LOGITS), r"backend='my-topk': expected a backend of "
                                                                       r"the ragged-logits operation"),
    ("torch", lambda: object(), r"case='object': expected a case of an operation: one of \['Case', "),
], ids=["topk-name-on-a-paged-case", "paged-on-a-topk-case", "topk-on-a-ragged-case", "not-a-case"])
def test_a_backend_of_another_operation_is_one_line_naming_it(backend: object, case: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        difftest.check(backend, case())


def test_a_topk_case_outside_the_contract_skips_with_the_reason() -> None:
    narrow = dataclasses.replace(kernels.TOPK, max_k=8)

    @difftest.backend(narrow, name="k8-only")
    def k8_only(logits: object, k: int, row_starts: object, row_ends: object) -> None:
        raise AssertionError("never called: the contract excludes the case")

    with pytest.raises(pytest.skip.Exception, match=r"k8-only cannot take random-ragged-k512-s3: k=512 exceeds the "
                                                    r"contract's max_k 8"):
        check_unobserved(k8_only, first_case(OperationKind.TOPK))
