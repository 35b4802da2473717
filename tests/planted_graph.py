"""Planted graph-replay bugs: backends right on every call made afresh, wrong once the per-layer call their
`prepare` returned runs again after the lengths changed, as a serving engine replays a captured graph
(`difftest run --graph`, difftest.engine.graph). A run without --graph calls prepare and its call on the
same inputs, so it never sees them. Load one as `--backend-module tests.planted_graph:ReusedSchedule`;
CrashesOnReplay kills its process and HangsOnReplay never returns: run them only under isolation.

Each computes the oracle's formula from the bytes it is handed (DeepGEMM's calling convention: per-row
lengths, block-split cache), reading the live lengths when it runs, and keeps one thing from `prepare`.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable

import torch

from difftest.core.contract import Contract
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from tests.user_backends import logits_with_limits

CONTRACT = Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                    mask=MaskConvention.TAIL_NEG_INF, devices=("cpu",), library="tests.planted_graph")
SPLIT = 16  # keys per split of ReusedSchedule's schedule


class _Planted:
    """What the planted backends share: their contract, and a call that is prepare's call made at once."""

    contract = CONTRACT

    def unavailable_reason(self, device: str) -> str | None:
        """None: the contract's devices say where it runs."""
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The whole call: prepared and launched on the same inputs, so always right."""
        return self.prepare(inputs, out)()  # type: ignore[attr-defined]


def _live_logits(inputs: KernelInputs) -> torch.Tensor:
    """The right logits of `inputs` as they hold now (their lengths read at this call)."""
    return logits_with_limits(inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens.to(torch.int64),
                              inputs.block_table, inputs.max_model_len)


def _kept_below(logits: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """`logits` with every position at or past its row's `limits` (rows,) set to -inf: what a kernel scores
    nothing of."""
    positions = torch.arange(logits.shape[1], device=logits.device)
    return logits.masked_fill(positions[None, :] >= limits[:, None], -math.inf)


class ReusedSchedule(_Planted):
    """(a) Metadata built in `prepare` from the lengths and reused: a schedule of SPLIT-key splits, as many
    per row as its length at prepare time needs; the call scores only the splits the schedule holds
    (masked by the live lengths). A row grown past its captured splits loses its new keys (FAIL)."""

    name = "planted-graph-reused-schedule"

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The schedule, from the lengths now; the call that runs on it."""
        splits = (inputs.context_lens.to(torch.int64).reshape(-1) + SPLIT - 1) // SPLIT
        covered = splits * SPLIT  # a copy: the schedule does not follow the lengths tensor
        return lambda: _kept_below(_live_logits(inputs), covered)


class SizeByValue(_Planted):
    """(b) A size captured by value: the longest length read as a Python int in `prepare`; the call scores
    no position past it. A replay whose longest row grows past the captured one loses those keys (FAIL)."""

    name = "planted-graph-size-by-value"

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The longest length, read now; the call that scores up to it."""
        longest = int(inputs.context_lens.max()) if inputs.context_lens.numel() else 0
        return lambda: _kept_below(_live_logits(inputs), torch.full((inputs.rows,), longest))


class Prepared(_Planted):
    """A right backend with a prepare split that keeps nothing: every replay passes."""

    name = "planted-graph-prepared"

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """Nothing built; the call reads everything when it runs."""
        return lambda: _live_logits(inputs)


class CrashesOnReplay(_Planted):
    """Right on the lengths it was prepared with; dies of SIGSEGV when called again on others, as a kernel
    reading through a pointer captured at prepare time into memory since freed does. Run it only under
    isolation: it takes its process down."""

    name = "planted-graph-crashes-on-replay"

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The lengths, kept; the call that dies when they changed."""
        return _unless_changed(inputs, lambda: os.kill(os.getpid(), signal.SIGSEGV))


class HangsOnReplay(_Planted):
    """Right on the lengths it was prepared with; never returns when called again on others, as a kernel
    spinning on a split count captured for other lengths does. Run it only under isolation with a timeout."""

    name = "planted-graph-hangs-on-replay"

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The lengths, kept; the call that hangs when they changed."""
        return _unless_changed(inputs, lambda: time.sleep(3600))


def _unless_changed(inputs: KernelInputs, fault: Callable[[], object]) -> Callable[[], torch.Tensor]:
    """The right call on `inputs`, which first runs `fault` when their lengths are no longer those of now."""
    kept = inputs.context_lens.clone()

    def call() -> torch.Tensor:
        if not torch.equal(kept, inputs.context_lens):
            fault()
        return _live_logits(inputs)

    return call
