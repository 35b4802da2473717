"""Top-k backends that kill or hang the process that calls them (one only on rows wider than it takes): what
worker isolation must contain for an operation other than paged logits (difftest.engine.isolate.OperationWorker);
one whose call runs out of memory, which earns it no verdict; one stopped as by SIGTERM. Right otherwise
(TorchTopk)."""

from __future__ import annotations

import os
import time

import torch

from difftest.backends.torch_topk import TorchTopk
from difftest.core.topk import TopkInputs


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
    """Right for two calls; the third raises KeyboardInterrupt, as the SIGTERM of a scheduler's `timeout` (which
    difftest's shells turn into one) arrives while a kernel runs."""

    name = "stopped-on-third-call"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            raise KeyboardInterrupt
        return super().__call__(inputs, out)
