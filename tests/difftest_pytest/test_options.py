"""The `difftest` option group: help, the header with the seed, usage errors, and the lazy imports."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

ONE_TEST = """
import difftest

def test_k(difftest_backend, difftest_case):
    difftest.check(difftest_backend, difftest_case)
"""


def test_help_lists_the_option_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--help")
    result.stdout.fnmatch_lines(["differential testing of indexer kernels against the oracle:",
                                 "*--difftest-backends=NAMES*", "*--difftest-seed=N*",
                                 "*--difftest-cases=KIND[[]:COUNT]*", "*--difftest-device=*",
                                 "*--difftest-report=PATH*", "*--difftest-repro-dir=DIR*", "*--difftest-suite*",
                                 "*--difftest-ledger=PATH*"])


def test_header_shows_the_options_that_repeat_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ONE_TEST)
    result = pytester.runpytest_inprocess("--co", "--difftest-seed=17", "--difftest-backends=torch",
                                          "--difftest-cases=random:1")
    result.stdout.fnmatch_lines(["difftest: --difftest-seed=17 --difftest-cases=random:1 --difftest-device=cpu "
                                 "--difftest-backends=torch"])


def test_a_random_seed_is_printed_and_kept_out_of_the_test_ids(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ONE_TEST)
    result = pytester.runpytest_inprocess("--co", "--difftest-backends=torch")
    header = re.search(r"^difftest: --difftest-seed=(\d+) ", result.stdout.str(), re.MULTILINE)
    assert header is not None, result.stdout.str()
    result.stdout.fnmatch_lines(["*<Function test_k[[]torch-all-padding]>", "*<Function test_k[[]torch-length-one]>"])


def test_without_options_the_header_comes_once_a_collected_test_uses_difftest(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ONE_TEST)
    result = pytester.runpytest_inprocess("--co", "-k", "torch-length-one")
    result.stdout.fnmatch_lines(["collected * items / * deselected / 1 selected",
                                 "difftest: --difftest-seed=* --difftest-cases=edges --difftest-device=cpu "
                                 "(every registered backend)"])


@pytest.mark.parametrize(("args", "message"), [
    (["--difftest-cases=sometimes"],
     "--difftest-cases='sometimes': expected one of random, edges, all, envelope, optionally with :COUNT >= 1 "
     "(e.g. random:4)"),
    (["--difftest-cases=random:0"], "--difftest-cases='random:0': expected one of random, edges, all, envelope, *"),
    (["--difftest-seed=-3"], "--difftest-seed='-3': expected a non-negative integer"),
    (["--difftest-device=tpu"], "--difftest-device='tpu': expected cpu or cuda"),
    (["--difftest-backends=torch,nope"],
     "--difftest-backends='nope': expected a registered name among [[]*'torch'*], or 'package.module:object'"),
    (["--difftest-backends=torch,,"], "--difftest-backends='torch,,': expected comma-separated backend names *"),
    (["--difftest-backends=no_such_module:fn"], "--difftest-backends='no_such_module:fn': expected an importable "
                                                "module (No module named 'no_such_module'; sys.path searched: *)"),
    (["--difftest-report=."], "--difftest-report='.': expected a file path, not a directory"),
])
def test_bad_values_are_usage_errors(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


@pytest.mark.parametrize(("args", "message"), [
    (["--difftest-op=bogus"], "--difftest-op='bogus': expected one of paged-logits, ragged-logits, topk, indexer, "
                              "prefill-indexer"),
    (["--difftest-op=topk", "--difftest-backends=torch-topk,nope"],
     "--difftest-backends='nope': expected a backend of the topk operation: a registered name among [[]*'torch-topk'*"),
    (["--difftest-op=ragged-logits", "--difftest-backends=torch"],
     "--difftest-backends='torch': expected a backend of the ragged-logits operation: a registered name among *"),
    (["--difftest-op=indexer", "--difftest-backends=torch+nope"],
     "--difftest-backends='torch+nope': expected a backend of the topk operation: *"),
    (["--difftest-op=prefill-indexer", "--difftest-backends=,"],
     "--difftest-backends=',': expected comma-separated backend names or package.module:object, none empty"),
    (["--difftest-op=topk", "--difftest-backends=no_such_module:fn"],
     "--difftest-backends='no_such_module:fn': expected an importable module (No module named 'no_such_module'*"),
], ids=["unknown-op", "topk-unknown-name", "ragged-given-a-paged-name", "indexer-unknown-half", "prefill-empty",
        "topk-no-module"])
def test_bad_operation_values_are_usage_errors(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    """The operation options a kernel engineer mistypes, one line each, as the paged ones are."""
    pytester.makepyfile(test_k=ONE_TEST)
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


LONG_NAME = "r" * 300  # past NAME_MAX (255): the filesystem refuses the name


@pytest.mark.parametrize(("option", "value", "reason"), [
    ("--difftest-report", "a-file/report.json", "cannot write: Not a directory"),
    ("--difftest-report", f"{LONG_NAME}.json", "cannot write: File name too long"),
    ("--difftest-report", f"{LONG_NAME}/report.json", "cannot write: File name too long"),
    ("--difftest-repro-dir", "a-file/repro", "cannot write: Not a directory"),
    ("--difftest-repro-dir", LONG_NAME, "cannot write: File name too long"),
])
def test_an_output_that_cannot_be_written_is_one_line_and_status_3(pytester: pytest.Pytester, option: str,
                                                                     value: str, reason: str) -> None:
    """As `difftest run` refuses such a --report (ExitStatus.IO), before any test runs."""
    (pytester.path / "a-file").write_text("a file, not a folder")
    pytester.makepyfile(ONE_TEST)
    result = pytester.runpytest_inprocess(f"{option}={value}")
    assert result.ret == 3, result.stderr.str()
    assert result.stderr.lines == [f"Exit: {option}={value!r}: {reason}"]
    assert result.stdout.str() == ""


def test_cuda_without_a_gpu_is_a_usage_error(pytester: pytest.Pytester) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --difftest-device=cuda is valid here")
    result = pytester.runpytest_inprocess("--difftest-device=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --difftest-device='cuda': expected a device torch can see "
                                 "(torch.cuda.is_available() is False)"])


def test_importing_the_plugin_imports_no_torch_and_nothing_heavy_of_difftest() -> None:
    heavy = ("torch", "numpy", "pydantic", "hypothesis", "difftest.oracles", "difftest.engine.runner",
             "difftest.engine.plan", "difftest.core.case", "difftest.core.schema")
    code = f"import sys, difftest_pytest.plugin; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_run_that_never_uses_difftest_never_imports_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import sys

        def test_plain():
            assert "torch" not in sys.modules and "difftest.engine.runner" not in sys.modules
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not re.search("^difftest", result.stdout.str(), re.MULTILINE), result.stdout.str()  # no header, no summary
