"""Hostile input to `difftest fuzz` (red-team pass of issue 29): each is one line naming the option, its value
and what is allowed, exit status 2, never a traceback; the campaign draws no case first."""

from __future__ import annotations

import pytest
import torch

from difftest.core.kinds import ExitStatus
from tests.support import run_cli

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
