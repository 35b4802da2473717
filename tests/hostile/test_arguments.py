"""Hostile arguments (issue 29's red-team pass): each was a traceback, a hang, or silently taken for
something else. Each is now one line naming the option or field, its value and what is allowed (exit 2),
or is simply done right."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from difftest.core.kinds import ExitStatus
from tests.support import CPU_OPERATION_BACKENDS, operation_bundle, operation_rows, run_cli

RUN = ["run", "--no-progress", "--cases", "edges", "--case-filter", "length-one-*", "--backends", "torch"]


def _one_line(code: int, err: str, want: ExitStatus = ExitStatus.USAGE) -> str:
    lines = err.strip().splitlines()
    assert code == want and len(lines) == 1 and "Traceback" not in err, f"{code=} {err=}"
    return lines[0]


@pytest.mark.parametrize("argv, says", [
    # silently accepted before
    (["run", "--no-progress", "--cases", "edges", "--backends", ""],
     "--backends='': expected comma-separated backend names"),
    (["run", "--no-progress", "--backends", "torch", "--spec", ""], "--spec='': expected a JSON object"),
    (["run", "--no-progress", "--backends", "torch", "--spec", '{"batch": 2, "batch": 1}'],
     "the key 'batch' is given twice"),
    (["run", "--no-progress", "--backends", "torch", "--count", "0"], "--count=0: expected an integer in [1, "),
    (["run", "--no-progress", "--cases", "random", "--backends", "torch", "--count", "0"],
     "--count=0: expected an integer in [1, "),
    # tracebacks before
    ([*RUN, "--backend-module", "..:x"], "--backends='..:x': expected 'package.module:object': dotted Python names"),
    ([*RUN, "--backend-module", "..evil:x"], "--backends='..evil:x': expected 'package.module:object'"),
    ([*RUN, "--backend-module", "difftest.cli:main"], "difftest.cli is difftest's own machinery"),
])
def test_a_hostile_argument_is_one_line(argv, says):
    code, _, err = run_cli(argv)
    assert says in _one_line(code, err), err


def test_shrink_refuses_a_budget_that_is_not_a_number_of_seconds(tmp_path):
    """`shrink --seconds nan` shrank for as long as it liked."""
    code, _, _ = run_cli(["run", "--no-progress", "--backend-module", "tests.planted:block_boundary_off_by_one",
                          "--spec", '{"lengths": [16], "heads": 4, "head_dim": 16}', "--repro-dir", str(tmp_path)])
    assert code == ExitStatus.FAILED
    (bundle,) = tmp_path.iterdir()
    for seconds in ("nan", "inf", "-1"):
        code, _, err = run_cli(["shrink", str(bundle), "--seconds", seconds, "--backends",
                                "tests.planted:block_boundary_off_by_one"])
        assert f"--seconds={float(seconds)!r}: expected a finite number of seconds >= 0" in _one_line(code, err), err


def test_resuming_a_report_without_its_run_record_keeps_its_results(tmp_path):
    """`--resume` of a report with no `run` key was a KeyError traceback."""
    report = tmp_path / "r.json"
    assert run_cli([*RUN, "--report", str(report)])[0] == ExitStatus.OK
    document = json.loads(report.read_text())
    del document["run"]
    report.write_text(json.dumps(document))
    code, out, err = run_cli([*RUN, "--resume", str(report), "--report", str(tmp_path / "again.json")])
    assert code == ExitStatus.OK and "Traceback" not in err, f"{out=} {err=}"
    assert json.loads((tmp_path / "again.json").read_text())["run"]["resumed"] == 1


@contextlib.contextmanager
def _at_most(seconds: int):
    """TimeoutError when the block takes longer (it blocks in open(): SIGALRM breaks it)."""
    def expired(signum, frame):
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_resuming_a_fifo_is_refused_not_waited_on(tmp_path):
    """`--resume FIFO` hung: the read waited for a writer that never came."""
    fifo = tmp_path / "earlier.jsonl"
    os.mkfifo(fifo)
    with _at_most(20):
        code, _, err = run_cli([*RUN, "--resume", str(fifo), "--report", str(tmp_path / "r.json")])
    assert "in a regular file (not a FIFO, device or folder)" in _one_line(code, err), err
    assert Path(fifo).exists()


# --------------------------------------------------------------------------- every operation's run, fuzz and shrink

OPERATION_RUN_ROWS = [
    (["--backends", "{b}", "--seed", str(2**64)], f"--seed={2**64}: expected an integer in [-2**62, 2**62)"),
    (["--backends", "{b}", "--count", str(10**9)], f"--count={10**9}: expected an integer in [1, "),
    (["--backends", "{b},,{b}"], "--backends=('{b}', '', '{b}'): expected None (every backend) or distinct non-empty"),
    (["--backends", "{b},{b}"], "--backends=('{b}', '{b}'): expected None (every backend) or distinct non-empty"),
    (["--backends", "{b}", "--budget", "0"], "--budget=0.0: expected a number of seconds > 0"),
    (["--backends", "{b}", "--budget", "-1"], "--budget=-1.0: expected a number of seconds > 0"),
    (["--backends", "{b}", "--budget", "nan"], "--budget=nan: expected a number of seconds > 0"),
]


@pytest.mark.parametrize("argv, says", operation_rows("run", OPERATION_RUN_ROWS))
def test_a_hostile_operation_argument_is_one_line(argv, says):
    """Tracebacks (a seed past int64, a billion seeds per spec), budgets that tested nothing and exited 0, and
    nonsense taken (empty and repeated backend names)."""
    code, _, err = run_cli(argv)
    assert says in _one_line(code, err), err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a visible GPU runs the cases: the refusal is for a host "
                    "without one")
@pytest.mark.parametrize("op", list(CPU_OPERATION_BACKENDS))
def test_an_operation_on_cuda_without_a_gpu_is_refused_as_paged_logits_is(op):
    """--device cuda on a host without one ran every case as a SKIP (or a traceback) and exited 0."""
    line = _one_line(*run_cli(["run", "--op", op, "--device", "cuda"])[::2])
    assert line == _one_line(*run_cli(["run", "--backends", "torch", "--device", "cuda"])[::2]), line
    assert line.startswith("difftest: error: --device='cuda': expected a device torch can see"), line


@pytest.mark.parametrize("op", list(CPU_OPERATION_BACKENDS))
def test_a_named_operation_backend_that_only_skips_fails_the_run_as_paged_logits_does(op):
    """It exited 0: a backend asked for by name that tested nothing passed as green."""
    idle = CPU_OPERATION_BACKENDS[op][1]
    code, _, err = run_cli(["run", "--op", op, "--backends", idle, "--device", "cpu"])
    line = _one_line(code, err, ExitStatus.FAILED)
    assert line.startswith(f"difftest: error: backend {idle!r}, asked for by name, tested nothing: "), line


@pytest.mark.parametrize("op", list(CPU_OPERATION_BACKENDS))
def test_an_operation_shrink_refuses_a_budget_that_is_not_a_number_of_seconds(op, tmp_path):
    """`shrink --seconds -1` of an operation's bundle was taken (the paged shrink refuses it)."""
    bundle = operation_bundle(op, tmp_path)
    for seconds in ("nan", "inf", "-1"):
        code, _, err = run_cli(["shrink", str(bundle), "--seconds", seconds])
        assert f"--seconds={float(seconds)!r}: expected a finite number of seconds >= 0" in _one_line(code, err), err
