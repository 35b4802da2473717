"""Top-k backends that kill or hang the process that calls them (one only on rows wider than it takes): what
worker isolation must contain for an operation other than paged logits (difftest.engine.isolate.OperationWorker);
one whose call runs out of memory, which earns it no verdict; one stopped as by SIGTERM; and the faults an
in-process run must survive (an exit, its own KeyboardInterrupt, a changed default dtype, a fork, a swallowed
interrupt), and one that hangs once it has said it started (a run to signal). Right otherwise (TorchTopk)."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

from difftest.backends.torch_topk import TorchTopk
from difftest.core.topk import TopkInputs
from tests.broken_backends import STARTED


class Aborts(TorchTopk):
    """Says why on stderr, then os.abort(): SIGABRT, as a C++ assertion in a kernel library ends a process."""

    name = "aborts"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        os.write(2, b"planted: the top-k kernel asserted\n")
        os.abort()


class Sleeps(TorchTopk):
    """Sleeps an hour before answering: a kernel that never finishes."""

    name = "sleeps"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        time.sleep(3600)
        return super().__call__(inputs, out)


class RunsOutOfMemory(TorchTopk):
    """Raises torch's out-of-memory error, as a call does on a GPU that other runs have filled."""

    name = "runs-out-of-memory"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 818.00 MiB (planted)")


class NarrowBuffer(TorchTopk):
    """Right on rows of up to 64 columns; a wider row aborts the process (a kernel's assertion on a row buffer of
    64 columns, a limit its contract does not declare)."""

    name = "narrow-buffer"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        if inputs.logits.shape[1] > 64:
            os.write(2, b"planted: a row wider than the 64-column buffer\n")
            os.abort()
        return super().__call__(inputs, out)


class StoppedOnThirdCall(TorchTopk):
    """Right for two calls; the third sends its process SIGTERM, as a scheduler's `timeout` does while a kernel
    runs (difftest's commands turn it into a stop, as Ctrl-C's)."""

    name = "stopped-on-third-call"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            signal.raise_signal(signal.SIGTERM)
        return super().__call__(inputs, out)


class Exits(TorchTopk):
    """sys.exit(0), as a wrapper that 'handles' a bad launch by exiting does: that backend's ERROR, never a green
    end of the run."""

    name = "exits"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        sys.exit(0)


class InterruptsItself(TorchTopk):
    """Raises a KeyboardInterrupt of its own (no signal came): that backend's ERROR, and the run goes on."""

    name = "interrupts-itself"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        raise KeyboardInterrupt("raised by the backend")


class SetsFloat64(TorchTopk):
    """Right, but switches torch's default dtype to float64 for everyone after it."""

    name = "sets-float64"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        torch.set_default_dtype(torch.float64)
        return super().__call__(inputs, out)


class ForksInBoth(TorchTopk):
    """Forks, and both processes return the right indices: the copy, left alone, would go on with the run."""

    name = "forks-in-both"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        os.fork()
        return super().__call__(inputs, out)


class SwallowsTheInterrupt(TorchTopk):
    """Gets the KeyboardInterrupt of a SIGINT that arrives while it runs (here it sends it itself), swallows it
    (a bare `except:` in a retry loop) and returns the right indices: the run must stop all the same."""

    name = "swallows-the-interrupt"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        try:
            signal.raise_signal(signal.SIGINT)
        except BaseException:
            pass
        return super().__call__(inputs, out)


class StartsThenHangs(TorchTopk):
    """Writes the file $DIFFTEST_TEST_STARTED (once its call has begun: what a test waits on before it signals
    the run), then sleeps an hour: a kernel the signal finds running."""

    name = "starts-then-hangs"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        with open(os.environ[STARTED], "a") as started:
            started.write(f"{os.getpid()}\n")
        time.sleep(3600)
        return super().__call__(inputs, out)
