"""Planted top-k bugs: backends right except for one thing, each the shape of a bug the field has had, and
the family of difftest.generators.topk that reaches it (PLANTED: backend, family spec, the verdict it shows).

Each starts from SGLang's torch reference (difftest.backends.torch_topk.TorchTopk: row-relative indices, -1
past the candidates, descending order) and breaks one thing.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from difftest.backends.torch_topk import TorchTopk
from difftest.core.kinds import NanRanking
from difftest.core.topk import TopkContract, TopkInputs
from difftest.core.verdict import Verdict

CONTRACT = dataclasses.replace(TorchTopk.contract, library="tests.planted_topk", devices=("cpu",))
TIE_CAP = 128  # values equal to the k-th that the tie-overflow bug keeps (sglang#35257 keeps 2048)


def _right(inputs: TopkInputs) -> torch.Tensor:
    return TorchTopk()(inputs, None)


def _values_of(inputs: TopkInputs, indices: torch.Tensor) -> torch.Tensor:
    """float32 [rows, k]: the logit each row-relative index names (-inf for -1)."""
    columns = (indices.long() + inputs.row_starts.long()[:, None]).clamp(0, inputs.logits.shape[1] - 1)
    return torch.where(indices >= 0, inputs.logits.gather(1, columns), -math.inf)


@dataclasses.dataclass
class Planted:
    """A planted backend: `name`, its contract, and the corruption applied to a right answer."""

    name: str
    corrupt: str
    contract: TopkContract = CONTRACT

    def unavailable_reason(self, device: str) -> str | None:
        """CPU only."""
        return None if device == "cpu" else "planted bugs run on the CPU"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The right answer with this backend's bug planted in it."""
        return getattr(self, f"_{self.corrupt}")(inputs, _right(inputs))

    @staticmethod
    def _tie_overflow(inputs: TopkInputs, right: torch.Tensor) -> torch.Tensor:
        """At most TIE_CAP values equal to the k-th are kept; the slots of the others take the next smaller
        values (a capped tie list, sglang#35257): FAIL(missing) where more ties are needed."""
        values = _values_of(inputs, right)
        out = right.clone()
        for row in range(right.shape[0]):
            kth = values[row][right[row] >= 0].min() if (right[row] >= 0).any() else None
            tied = torch.nonzero((values[row] == kth) & (right[row] >= 0)).flatten() if kth is not None else []
            if len(tied) <= TIE_CAP:
                continue
            start, length = int(inputs.row_starts[row]), int(inputs.lengths[row])
            window = inputs.logits[row, start:start + length]
            below = torch.nonzero(window < kth).flatten()
            below = below[window[below].argsort(descending=True)][:len(tied) - TIE_CAP]
            out[row, tied[TIE_CAP:TIE_CAP + len(below)]] = below.to(out.dtype)
            out[row, tied[TIE_CAP + len(below):]] = -1
        return out

    @staticmethod
    def _absolute(inputs: TopkInputs, right: torch.Tensor) -> torch.Tensor:
        """Absolute columns returned under a row-relative contract (vllm#56749): FAIL(out-of-window) where a
        window starts past 0."""
        return torch.where(right >= 0, right + inputs.row_starts[:, None], right)

    @staticmethod
    def _no_padding(inputs: TopkInputs, right: torch.Tensor) -> torch.Tensor:
        """-1 only past the window length, -inf positions returned (the PAST_WINDOW convention) under a contract
        that promises -1 past the candidates: FAIL(padding) where a window holds fewer than k candidates."""
        start, length = inputs.row_starts.long()[:, None], inputs.lengths.long()[:, None]
        columns = torch.arange(inputs.logits.shape[1], device=right.device)
        masked = torch.where((columns >= start) & (columns < start + length), inputs.logits, math.nan)
        valid = min(right.shape[1], inputs.logits.shape[1])
        order = masked.nan_to_num(nan=-math.inf, neginf=-3e38).argsort(dim=1, descending=True)[:, :valid]
        keep = torch.arange(valid, device=right.device)[None, :] < length
        out = torch.full_like(right, -1)
        out[:, :valid] = torch.where(keep, order - start, -1).to(right.dtype)
        return out

    @staticmethod
    def _duplicate(inputs: TopkInputs, right: torch.Tensor) -> torch.Tensor:
        """The last slot of a full row repeats its first: FAIL(duplicate)."""
        out = right.clone()
        full = (right >= 0).all(dim=1) & (right.shape[1] > 1)
        out[full, -1] = out[full, 0]
        return out

    @staticmethod
    def _window_end(inputs: TopkInputs, right: torch.Tensor) -> torch.Tensor:
        """The window taken as [start, end] (one column too many, off by one at its end): the column at `end`
        competes, FAIL(out-of-window) where it holds a large value."""
        width = inputs.logits.shape[1]
        longer = dataclasses.replace(inputs, lengths=(inputs.lengths + 1).clamp(
            max=width - inputs.row_starts).to(inputs.lengths.dtype))
        return _right(longer)

    @staticmethod
    def _ascending(inputs: TopkInputs, right: torch.Tensor) -> torch.Tensor:
        """The right set, its real indices in ascending order of value (pads still last) under a contract that
        promises descending order: FAIL(order)."""
        real = (right >= 0).sum(dim=1, keepdim=True)
        slots = torch.arange(right.shape[1], device=right.device)[None, :]
        reversed_slots = torch.where(slots < real, real - 1 - slots, slots)
        return right.gather(1, reversed_slots)

    @staticmethod
    def _random_ties(inputs: TopkInputs, right: torch.Tensor) -> torch.Tensor:
        """Right, its choice among values tied with the k-th random on every call (first-come atomics,
        vllm#53691): must PASS."""
        start, length = inputs.row_starts.long()[:, None], inputs.lengths.long()[:, None]
        columns = torch.arange(inputs.logits.shape[1], device=right.device)
        inside = (columns >= start) & (columns < start + length)
        masked = torch.where(inside, inputs.logits, -math.inf)
        shuffle = torch.rand(masked.shape, device=masked.device).argsort(dim=1)  # a fresh tie order per call
        values, picked = torch.sort(masked.gather(1, shuffle), dim=1, descending=True, stable=True)
        k = right.shape[1]
        chosen = shuffle.gather(1, picked)[:, :k] - start
        return torch.where(values[:, :k] > -math.inf, chosen, -1).to(right.dtype)

    @staticmethod
    def _nan_garbage(inputs: TopkInputs, right: torch.Tensor) -> torch.Tensor:
        """Rows holding a NaN leave their slots unwritten: uninitialised memory comes back (vllm#49896):
        FAIL(garbage) even where the NaN ranking is undefined."""
        has_nan = torch.isnan(inputs.logits).any(dim=1)
        junk = torch.full_like(right, 0x7F7F7F7F)
        return torch.where(has_nan[:, None], junk, right)


# (backend, the family spec of difftest.generators.topk.topk_plan that reaches it, the verdict it shows)
PLANTED: tuple[tuple[Planted, str, Verdict], ...] = (
    (Planted("planted-tie-overflow", "tie_overflow"), "ties-straddle", Verdict.FAIL_MISSING),
    (Planted("planted-absolute", "absolute"), "prefill-windows", Verdict.FAIL_OUT_OF_WINDOW),
    (Planted("planted-no-padding", "no_padding"), "few-candidates", Verdict.FAIL_PADDING),
    (Planted("planted-duplicate", "duplicate"), "random-k512", Verdict.FAIL_DUPLICATE),
    (Planted("planted-window-end", "window_end"), "prefill-windows", Verdict.FAIL_OUT_OF_WINDOW),
    (Planted("planted-ascending", "ascending"), "random-k512", Verdict.FAIL_ORDER),
    (Planted("planted-nan-garbage", "nan_garbage", dataclasses.replace(CONTRACT, nan=NanRanking.UNDEFINED)),
     "nan-inside", Verdict.FAIL_GARBAGE),
    (Planted("planted-random-ties", "random_ties"), "ties-straddle", Verdict.PASS),
)
