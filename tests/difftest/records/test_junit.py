"""`difftest run --junit`: one testcase per backend and case; a failure's text is its table row and block."""

from __future__ import annotations

from junitparser import Failure, JUnitXml

from difftest.core.kinds import ExitStatus
from tests.support import run_cli

SPEC = '{"lengths": [0, 1, 16, 17], "next_n": 2, "heads": 2, "head_dim": 16, "block_size": 16, "max_model_len": 32}'


def test_run_writes_one_testcase_per_backend_and_case(tmp_path):
    path = tmp_path / "junit.xml"
    code, out, err = run_cli(["run", "--backends", "torch,tests.planted:block_boundary_off_by_one", "--spec", SPEC,
                              "--count", "2", "--no-progress", "--junit", str(path)])
    assert code == ExitStatus.FAILED and f"junit: {path}" in out, f"{code=}\n{out}\n{err}"
    junit = JUnitXml.fromfile(str(path))
    cases = [case for suite in junit for case in suite]
    assert sorted((c.classname, c.name) for c in cases) == [
        ("planted-block-boundary", "random-s0"), ("planted-block-boundary", "random-s1"),
        ("torch", "random-s0"), ("torch", "random-s1")], junit.tostring()
    failures = [r for c in cases for r in c.result if isinstance(r, Failure)]
    assert len(failures) == 2 and all(f.type == "FAIL(mask)" for f in failures), junit.tostring()
    text = failures[0].text
    assert text.startswith("backend ") and "rows with the wrong -inf mask" in text and "first mismatch" in text, text


def test_an_unwritable_junit_path_is_status_3(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli(["run", "--backends", "torch", "--spec", SPEC, "--no-progress",
                            "--junit", str(blocker / "junit.xml")])
    assert code == ExitStatus.IO and err.startswith("difftest: error: --junit="), err
