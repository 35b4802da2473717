"""Backends that attack the process they run in (issue 29's red-team pass; tests.hostile.rogue_backends).
Run in-process (the CPU default), a backend shares the run's process: whatever it does to that process,
the run must not pass for green, lose its report or print a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from difftest.core.kinds import ExitStatus
from tests.support import REPO_ROOT, run_cli

ROGUE = "tests.hostile.rogue_backends"
ONE_CASE = ["--no-progress", "--cases", "edges", "--case-filter", "length-one-*"]
CASES = [*ONE_CASE, "--case-filter", "block-boundaries-*"]  # two shapes: an answer to one cannot pass for the other's


def _difftest(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The installed command, `python -m difftest`, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "difftest", *argv], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_a_backend_that_exits_0_does_not_pass_for_a_green_run():
    """`os._exit(0)` in an in-process backend gave exit 0 and no output: a false green."""
    done = _difftest("run", *ONE_CASE, "--backends", "torch", "--backend-module", f"{ROGUE}:exits_zero")
    assert done.returncode == ExitStatus.FAILED, done
    assert "the command's process ended (exit status 0) before the command did" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_backend_that_changes_torchs_defaults_leaves_the_run_its_own(tmp_path):
    """`torch.set_default_dtype(torch.float64)` in a backend ended the run as a usage error, no report."""
    report = tmp_path / "r.json"
    try:
        code, out, err = run_cli(["run", *CASES, "--backends", "torch", "--backend-module", f"{ROGUE}:sets_float64",
                                  "--report", str(report)])
        assert torch.get_default_dtype() == torch.float32, "the backend's default dtype outlived its call"
    finally:
        torch.set_default_dtype(torch.float32)
    assert code == ExitStatus.OK, f"{out=} {err=}"
    verdicts = {(r["backend"], r["verdict"]) for r in json.loads(report.read_text())["results"]}
    assert verdicts == {("torch", "PASS"), ("rogue-sets-float64", "PASS")}, verdicts


def test_an_exception_that_cannot_be_printed_is_the_backends_error():
    """An exception whose __str__ raises gave a traceback instead of an ERROR."""
    code, out, err = run_cli(["run", *CASES, "--backend-module", f"{ROGUE}:unprintable_error", "-v"])
    assert code == ExitStatus.FAILED and "Traceback" not in err, f"{out=} {err=}"
    assert "ERROR" in out and "Unprintable: <str() of this Unprintable raised ValueError>" in out, out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2:][:1] not in ("Z", "X")


def test_a_backend_that_forks_neither_doubles_the_run_nor_outlives_it(tmp_path):
    """A backend forking and returning in both processes hung the run in-process (its copy went on with
    the run); a child it forks and leaves running outlived the run."""
    pids = tmp_path / "pids"
    report = tmp_path / "r.json"
    done = _difftest("run", *ONE_CASE, "--backends", "torch", "--backend-module", f"{ROGUE}:forks_in_both",
                     "--backend-module", f"{ROGUE}:leaves_a_sleeper", "--report", str(report),
                     env={"ROGUE_PIDS": str(pids)})
    assert done.returncode == ExitStatus.OK, done
    assert done.stdout.count("\nrogue-forks-in-both ") == 1, f"one table, one run: {done.stdout}"
    results = json.loads(report.read_text())["results"]
    assert len(results) == 3 and {r["verdict"] for r in results} == {"PASS"}, results
    sleepers = [int(line) for line in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in sleepers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(sleepers) == 1 and not any(_alive(pid) for pid in sleepers), "a backend's child outlived the run"


def test_a_forking_backend_in_a_worker_answers_each_case_once(tmp_path):
    """Under --isolate the forked copy answered too, and its answer was taken for the next case's."""
    report = tmp_path / "r.json"
    code, out, err = run_cli(["run", *CASES, "--backend-module", f"{ROGUE}:forks_in_both", "--isolate",
                              "--timeout", "60", "--report", str(report)])
    results = json.loads(report.read_text())["results"]
    assert code == ExitStatus.OK, f"{out=} {err=}"
    assert [(r["case"], r["verdict"]) for r in results] == [
        ("length-one-s1000", "PASS"), ("block-boundaries-s3000", "PASS")], results
