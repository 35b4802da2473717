"""Backends that attack the process they run in (issue 29's red-team pass), for
tests/hostile/test_backends_in_process.py: `--backend-module tests.hostile.rogue_backends:<name>`.

Each computes the right logits (the oracle's formula on the bytes it is handed) and does one thing
to its process besides:

    exits_zero            os._exit(0): the run's process ends, with the status of a run that passed
    sets_float64          torch.set_default_dtype(torch.float64) and leaves it so
    unprintable_error     raises an exception whose __str__ raises
    forks_in_both         forks, and returns its logits in both processes
    leaves_a_sleeper      forks a child that sleeps for an hour (its pid appended to $ROGUE_PIDS)
"""

from __future__ import annotations

import os
import time

import torch

from difftest.backends.user import backend
from tests.broken_backends import CONTRACT
from tests.user_backends import logits_with_limits


@backend(contract=CONTRACT, name="rogue-exits-zero")
def exits_zero(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Ends the process with status 0, as a kernel library calling exit(0) on an error path does."""
    os._exit(0)


@backend(contract=CONTRACT, name="rogue-sets-float64")
def sets_float64(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Right, but switches torch's default dtype to float64 for everyone after it."""
    torch.set_default_dtype(torch.float64)
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)


class Unprintable(RuntimeError):
    """An exception whose message cannot be made."""

    def __str__(self) -> str:
        raise ValueError("no message for you")


@backend(contract=CONTRACT, name="rogue-unprintable-error")
def unprintable_error(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Raises Unprintable."""
    raise Unprintable()


@backend(contract=CONTRACT, name="rogue-forks-in-both")
def forks_in_both(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Forks, and both processes return the logits: the child, left alone, goes on with the run."""
    os.fork()
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)


@backend(contract=CONTRACT, name="rogue-leaves-a-sleeper")
def leaves_a_sleeper(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Forks a child that sleeps for an hour, appends its pid to the file $ROGUE_PIDS, and returns the
    logits."""
    child = os.fork()
    if child == 0:
        time.sleep(3600)
        os._exit(0)
    with open(os.environ["ROGUE_PIDS"], "a") as pids:
        pids.write(f"{child}\n")
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)
