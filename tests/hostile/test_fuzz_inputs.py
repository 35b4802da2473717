"""Hostile input to `difftest fuzz` (red-team pass of issue 29): each is one line naming the option, its value
and what is allowed, exit status 2, never a traceback; the campaign draws no case first."""

from __future__ import annotations

import pytest
import torch

from difftest.core.kinds import ExitStatus
from tests.support import CPU_OPERATION_BACKENDS, operation_rows, run_cli

FUZZ = ["fuzz", "--budget", "5s", "--backends", "torch"]


def _one_line_usage_error(argv: list[str]) -> str:
    status, out, err = run_cli(argv)
    assert status == ExitStatus.USAGE, (status, out, err)
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("difftest: error: "), err
    return err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a visible GPU runs the campaign: the refusal is for a host "
                    "without one")
def test_a_cuda_campaign_without_a_gpu_is_refused_in_one_line_as_run_refuses_it():
    fuzz_line = _one_line_usage_error([*FUZZ, "--device", "cuda"])
    run_line = _one_line_usage_error(["run", "--backends", "torch", "--device", "cuda"])
    assert fuzz_line == run_line and fuzz_line.startswith("difftest: error: --device='cuda': expected a device")


@pytest.mark.parametrize("seed", [2**64, 2**63, 2**62, -(2**62) - 1, -(2**64)])
def test_a_seed_out_of_range_names_the_option_its_value_and_the_range(seed):
    line = _one_line_usage_error([*FUZZ, "--seed", str(seed)])
    assert line == f"difftest: error: --seed={seed!r}: expected an integer in [-2**62, 2**62)\n"


@pytest.mark.parametrize(("value", "shown"), [("nan", "nan"), ("inf", "inf"), ("-1", "-1.0"), ("6", "6.0")])
def test_a_shrinking_share_outside_the_budget_names_the_option(value, shown):
    line = _one_line_usage_error([*FUZZ, "--shrink-seconds", value])
    assert line == f"difftest: error: --shrink-seconds={shown}: expected seconds in [0, budget = 5]\n"


# --------------------------------------------------------------------------- every operation's campaign

OPERATION_FUZZ_ROWS = [
    (["--backends", "{b}", "--budget", "1e400"], "--budget=inf: expected seconds in (0, one week]"),
    (["--backends", "{b}", "--budget", "0"], "--budget=0.0: expected seconds in (0, one week]"),
    (["--backends", "{b}", "--budget", "-1"], "--budget=-1.0: expected seconds in (0, one week]"),
    (["--backends", "{b}", "--budget", "nan"], "--budget=nan: expected seconds in (0, one week]"),
    (["--backends", "{b}", "--budget", "1", "--until-failures", "0"], "--until-failures=0: expected an integer >= 1"),
    (["--backends", "{b}", "--budget", "1", "--seed", str(2**64)],
     f"--seed={2**64}: expected an integer in [-2**62, 2**62)"),
    (["--backends", "{b},{b}", "--budget", "1"], "--backends=('{b}', '{b}'): expected None (every backend) or"),
    (["--backends", "{b},,{b}", "--budget", "1"], "--backends=('{b}', '', '{b}'): expected None (every backend) or"),
]


@pytest.mark.parametrize("argv, says", operation_rows("fuzz", OPERATION_FUZZ_ROWS))
def test_a_hostile_operation_campaign_argument_is_one_line(argv, says):
    """A campaign that never ended (an infinite budget), budgets that tested nothing and exited 0, a seed past
    int64 (a traceback), and nonsense taken (--until-failures 0, empty and repeated backend names)."""
    assert says in _one_line_usage_error(argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a visible GPU runs the campaign: the refusal is for a host "
                    "without one")
@pytest.mark.parametrize("op", list(CPU_OPERATION_BACKENDS))
def test_an_operation_campaign_on_cuda_without_a_gpu_is_refused_as_run_refuses_it(op):
    fuzz_line = _one_line_usage_error(["fuzz", "--op", op, "--budget", "1", "--device", "cuda"])
    assert fuzz_line == _one_line_usage_error(["run", "--backends", "torch", "--device", "cuda"]), fuzz_line
