"""What `difftest run` prints: --quiet, --verbose, the progress bar, a named backend that tested
nothing, an error's traceback, and a reader that leaves early (`| head`)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

from difftest.cli import main
from difftest.core.kinds import ExitStatus
from tests import broken_backends as bb
from tests.support import REPO_ROOT, run_cli

ONE_CASE = ["run", "--cases", "edges", "--case-filter", "length-one-*", "--backends", "torch"]


def test_quiet_prints_only_the_verdict_line():
    code, out, err = run_cli([*ONE_CASE, "--quiet"])
    assert code == ExitStatus.OK and out == "PASS: 1 results: torch PASS\n" and err == "", f"{out=} {err=}"


def test_verbose_prints_every_result_passing_ones_too():
    code, quiet_table, _ = run_cli([*ONE_CASE, "--no-progress"])
    assert "torch on length-one-s1000" not in quiet_table, quiet_table
    code, out, _ = run_cli([*ONE_CASE, "--no-progress", "--verbose"])
    assert code == ExitStatus.OK and "\ntorch on length-one-s1000 [B=" in out and ": PASS in " in out, out


def test_an_errors_traceback_is_in_the_failure_block_and_whole_under_verbose(tmp_path):
    nested = [*ONE_CASE, "--backend-module", "tests.broken_backends:raises_nested", "--no-progress"]
    code, out, _ = run_cli([*nested, "--verbose", "--report", str(tmp_path / "r.json")])
    assert code == ExitStatus.FAILED and "    traceback:\n      Traceback (most recent call last):\n" in out, out
    assert all(line in out for line in bb.nested_traceback_lines()), out
    assert json.loads((tmp_path / "r.json").read_text())["results"][1]["traceback"].startswith("Traceback (")
    code, out, _ = run_cli(nested)
    assert "    traceback:" in out and bb.nested_traceback_lines()[0] in out, "short: the innermost lines are kept"


def test_quiet_and_verbose_together_is_one_line_exit_2():
    code, _, err = run_cli([*ONE_CASE, "--quiet", "--verbose"])
    assert code == ExitStatus.USAGE and err.count("\n") == 1 and "not allowed with argument" in err, err


def test_a_named_backend_that_skips_every_case_fails_the_run_and_says_why():
    code, out, err = run_cli([*ONE_CASE, "--backend-module", "tests.user_backends:DeclaresCudaOnly", "--quiet"])
    assert code == ExitStatus.FAILED and out.startswith("FAIL: 2 results: torch PASS, cuda-only SKIP"), out
    assert err == ("difftest: error: backend 'cuda-only', asked for by name, tested nothing: contract devices "
                   "['cuda'] exclude cpu\n"), err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_the_case_and_an_eta_on_a_terminal_only():
    err = _Terminal()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main([*ONE_CASE, "--case-filter", "block-boundaries-*"]) == ExitStatus.OK
    drawn = err.getvalue()
    # tqdm's "1/2 [00:00<00:01, ...]": done of planned, elapsed < ETA; then the case reported last
    assert "torch on length-one-s1000" in drawn and "/2 [" in drawn and "<" in drawn, f"{drawn=}"
    for quiet in (["--no-progress"], ["--quiet"]):
        err = _Terminal()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            main([*ONE_CASE, *quiet])
        assert err.getvalue() == "", f"{quiet=}: {err.getvalue()=}"
    _, _, not_a_terminal = run_cli(ONE_CASE)
    assert not_a_terminal == "", not_a_terminal


def test_a_reader_that_leaves_early_gets_no_traceback():
    piped = [subprocess.Popen(f"set -o pipefail; {sys.executable} -m difftest.cli {' '.join(argv)} | head -c 1",
                              shell=True, executable="/bin/bash", cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for argv in (["backends"], [*ONE_CASE, "--verbose"])]  # side by side: each imports torch
    for shell in piped:
        out, err = shell.communicate(timeout=120)
        assert err == "" and shell.returncode == 0 and len(out) == 1, (shell.args, shell.returncode, out, err)



def test_the_run_says_how_many_calls_memory_shaped(tmp_path, monkeypatch):
    """One line after the table: calls retried alone, run one at a time, SKIPs for want of memory; the
    SKIP's reason gives the bytes, and a backend that only skipped is named as having tested nothing."""
    monkeypatch.setenv("DIFFTEST_TEST_MARKERS", str(tmp_path))
    code, out, err = run_cli(["run", "--backends", "torch,tests.memory_backends:oom_on_first_call,"
                              "tests.memory_backends:oom_always", "--cases", "edges", "--case-filter", "length-one*",
                              "--no-progress"])
    assert code == ExitStatus.FAILED and "'oom-always', asked for by name, tested nothing: out of memory" in err, err
    assert ("memory: 2 calls ran out of memory beside others and were tried again alone (1 passed there); 2 calls "
            "ran one at a time; 1 SKIP for want of memory (reasons in the report)") in out, out
