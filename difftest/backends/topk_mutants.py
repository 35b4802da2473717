"""Top-k mutants for `difftest selftest`: torch's top-k as SGLang's reference path calls it
(difftest.backends.torch_topk.TorchTopk) and a copy of it per top-k bug class, each switched on by a `TopkMutation`.

Two must pass: the correct one, and one that picks among values tied with the k-th at random on every launch
(first-come atomics do that; any choice among ties is right). The others plant a capped candidate buffer
(sglang#35257), vLLM's padding convention under a contract that promises SGLang's, and absolute columns where
row-relative indices are promised (vllm#56749). Every one keeps TorchTopk's contract (row-relative indices, -1
past the candidates, descending order, NaN ranked highest), so the same oracle judges them all.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math

import torch

from difftest.backends.torch_topk import TorchTopk
from difftest.core.topk import TopkContract, TopkInputs

# Candidates at or above the k-th value a capped buffer holds: sglang#35257 keeps 2048, so only rows with more
# than 2048 such values (ties past 2048 at k = 2048) lose any.
CANDIDATE_BUFFER = 2048


class TopkMutation(str, enum.Enum):
    """What a top-k mutant changes in torch's top-k."""

    NONE = "none"
    RANDOM_TIES = "random-ties"  # a fresh choice among values tied with the k-th on every launch: right
    CANDIDATE_BUFFER = "candidate-buffer"  # candidates past CANDIDATE_BUFFER (in column order) dropped
    PADDED_PAST_WINDOW = "padded-past-window"  # -1 only past the window length: -inf positions returned
    ABSOLUTE_INDICES = "absolute-indices"  # columns of the row, not offsets from the window's start


class TorchTopkMutant:
    """torch's top-k with `mutation` planted, under TorchTopk's contract."""

    def __init__(self, mutation: TopkMutation, name: str) -> None:
        self.mutation = mutation
        self.name = name
        self.contract: TopkContract = dataclasses.replace(
            TorchTopk.contract, library=f"difftest.backends.topk_mutants (torch {torch.__version__})")
        self._launches = itertools.count()  # RANDOM_TIES's shuffle moves on every launch

    def unavailable_reason(self, device: str) -> str | None:
        """As TorchTopk: None on the CPU, why torch sees no GPU on 'cuda'."""
        return TorchTopk().unavailable_reason(device)

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """int32 [rows, k]: TorchTopk's answer with this mutant's bug."""
        if self.mutation == TopkMutation.RANDOM_TIES:
            return _shuffled(inputs, next(self._launches))
        if self.mutation == TopkMutation.CANDIDATE_BUFFER:
            return TorchTopk()(_buffer_overflowed(inputs), None)
        if self.mutation == TopkMutation.PADDED_PAST_WINDOW:
            return _padded_past_window(inputs)
        right = TorchTopk()(inputs, None)
        if self.mutation == TopkMutation.ABSOLUTE_INDICES:
            return torch.where(right >= 0, right + inputs.row_starts.to(right.dtype)[:, None], right)
        return right


def _inside(inputs: TopkInputs) -> torch.Tensor:
    """bool [rows, width]: each row's window."""
    starts, ends = inputs.windows()
    columns = torch.arange(inputs.logits.shape[1], device=inputs.logits.device)[None, :]
    return (columns >= starts[:, None]) & (columns < ends[:, None])


def _shuffled(inputs: TopkInputs, launch: int) -> torch.Tensor:
    """TorchTopk on columns shuffled by a permutation drawn from `launch`, its picks mapped back: torch.topk
    then meets the tied values in another order, so it returns another choice among them."""
    width = inputs.logits.shape[1]
    order = torch.randperm(width, generator=torch.Generator().manual_seed(launch)).to(inputs.logits.device)
    starts, _ends = inputs.windows()
    masked = torch.where(_inside(inputs), inputs.logits, -math.inf)[:, order].contiguous()
    whole = TopkInputs(logits=masked, k=inputs.k, form=inputs.form, row_starts=torch.zeros_like(starts),
                       lengths=torch.full_like(starts, width))
    picked = TorchTopk()(whole, None)  # columns of the shuffled rows, -1 where the value is -inf
    columns = order[picked.clamp(min=0).long()] - starts[:, None]
    return torch.where(picked >= 0, columns, -1).to(torch.int32)


def _buffer_overflowed(inputs: TopkInputs) -> TopkInputs:
    """The inputs as a kernel with a capped candidate buffer sees them: of the window's values at or above the
    k-th (NaN included: it ranks highest), those past the first CANDIDATE_BUFFER in column order are lost (-inf)."""
    inside = _inside(inputs)
    masked = torch.where(inside, inputs.logits, -math.inf)
    valid = min(inputs.k, masked.shape[1])
    kth = torch.topk(masked.nan_to_num(nan=math.inf), valid, dim=1).values[:, -1:]  # the k-th largest
    kept = inside & ((masked >= kth) | torch.isnan(masked)) & (kth > -math.inf)
    lost = kept & (kept.cumsum(dim=1) > CANDIDATE_BUFFER)
    return dataclasses.replace(inputs, logits=inputs.logits.masked_fill(lost, -math.inf))


def _padded_past_window(inputs: TopkInputs) -> torch.Tensor:
    """vLLM's convention: -inf positions inside the window rank below every logit but above the columns outside
    it, so they fill what the candidates leave, and -1 only in the slots past the window length."""
    starts, ends = inputs.windows()
    inside = _inside(inputs)
    lowest = -torch.finfo(torch.float64).max  # below every float32, above -inf
    keys = torch.where(inside, inputs.logits.double().masked_fill(inputs.logits == -math.inf, lowest), -math.inf)
    valid = min(inputs.k, keys.shape[1])
    picked = torch.topk(keys, valid, dim=1).indices - starts[:, None]
    slots = torch.arange(valid, device=keys.device)[None, :]
    indices = torch.full((keys.shape[0], inputs.k), -1, dtype=torch.int32, device=keys.device)
    indices[:, :valid] = torch.where(slots < (ends - starts)[:, None], picked, -1).to(torch.int32)
    return indices
