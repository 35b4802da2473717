"""`difftest run --junit`: one testcase per backend and case; a failure's text is its table row and block."""

from __future__ import annotations

import dataclasses
import json
import sys
import xml.etree.ElementTree as ET

from difftest.backends import get_backends
from difftest.core.kinds import ExitStatus
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.generators import CaseSpec, build_case
from difftest.records import junit
from difftest.workflows.running import run
from tests.support import run_cli

SPEC = '{"lengths": [0, 1, 16, 17], "next_n": 2, "heads": 2, "head_dim": 16, "block_size": 16, "max_model_len": 32}'


def test_run_writes_one_testcase_per_backend_and_case(tmp_path):
    path = tmp_path / "junit.xml"
    code, out, err = run_cli(["run", "--backends", "torch,tests.planted:block_boundary_off_by_one", "--spec", SPEC,
                              "--count", "2", "--no-progress", "--junit", str(path)])
    assert code == ExitStatus.FAILED and f"junit: {path}" in out, f"{code=}\n{out}\n{err}"
    junit = ET.parse(path).getroot()
    cases = junit.findall("testsuite/testcase")
    assert sorted((c.get("classname"), c.get("name")) for c in cases) == [
        ("planted-block-boundary", "random-s0"), ("planted-block-boundary", "random-s1"),
        ("torch", "random-s0"), ("torch", "random-s1")], path.read_text()
    failures = junit.findall("testsuite/testcase/failure")
    assert len(failures) == 2 and all(f.get("type") == "FAIL(mask)" for f in failures), path.read_text()
    counts = {key: junit.get(key) for key in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": "4", "failures": "2", "errors": "0", "skipped": "0"}, counts
    text = failures[0].text or ""
    assert text.startswith("backend ") and "rows with the wrong -inf mask" in text and "first mismatch" in text, text


def test_an_unwritable_junit_path_is_status_3(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli(["run", "--backends", "torch", "--spec", SPEC, "--no-progress",
                            "--junit", str(blocker / "junit.xml")])
    assert code == ExitStatus.IO and err.startswith("difftest: error: --junit="), err


def test_run_junit_needs_no_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "junitparser", None)  # as if not installed
    path = tmp_path / "junit.xml"
    code, _, err = run_cli(["run", "--backends", "torch", "--spec", SPEC, "--no-progress", "--junit", str(path)])
    assert code == ExitStatus.OK and ET.parse(path).getroot().get("tests") == "1", f"{code=} {err=}"


def test_characters_xml_cannot_hold_are_escaped_and_the_file_parses(tmp_path):
    results = run(get_backends(["tests.planted:block_boundary_off_by_one"]),
                  [build_case(CaseSpec.from_json(json.loads(SPEC)), seed=0)], RunConfig())
    hostile = [dataclasses.replace(r, case="case\x1b[31m\x00", reason="\x07") for r in results]
    path = junit.write(tmp_path / "junit.xml", [junit.suite("suite\x0b", hostile)])
    root = ET.parse(path).getroot()
    assert root.find("testsuite").get("name") == "suite\\x0b", path.read_text()[:300]
    assert root.find("testsuite/testcase").get("name") == "case\\x1b[31m\\x00", path.read_text()[:300]


def test_a_failure_says_what_failed_in_its_message_in_the_results_own_words(tmp_path):
    [result] = run(get_backends(["tests.planted:block_boundary_off_by_one"]),
                   [build_case(CaseSpec.from_json(json.loads(SPEC)), seed=0)], RunConfig())
    said = [result,  # a paged failure: its block says it, row by row
            dataclasses.replace(result, case="error", verdict=Verdict.ERROR, reason="ValueError: boom\ntraceback"),
            dataclasses.replace(result, case="topk", verdict=Verdict.FAIL_OUT_OF_WINDOW,
                                headline="3/16 rows select a wrong set (41 tokens)")]
    root = ET.parse(junit.write(tmp_path / "junit.xml", [junit.suite("suite", said)])).getroot()
    messages = [(c.find("failure") if c.find("failure") is not None else c.find("error")).get("message")
                for c in root.iter("testcase")]
    assert messages == ["FAIL(mask): planted-block-boundary on random-s0",
                        "ERROR: planted-block-boundary on error: ValueError: boom",
                        "FAIL(out-of-window): planted-block-boundary on topk: 3/16 rows select a wrong set (41 tokens)"]
