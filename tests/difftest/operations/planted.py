"""Backends with a planted bug, and their correct twins, for the operation tests: the ragged oracle's own
fp32 logits (right), the same with the last key of every window of two keys or more masked to -inf (a wrong
-inf mask), torch.topk row by row (right: the torch-topk backend) and a top-k that ranks the whole row,
ignoring its window (out-of-window indices), and one right on its first launch only."""

from __future__ import annotations

import math

import torch

from difftest.core.kinds import IndexConvention, LogitsForm, MaskConvention, NanRanking, TopkPadding, WindowForm
from difftest.core.ragged import RaggedContract, RaggedInputs
from difftest.core.topk import TopkContract, TopkInputs
from difftest.oracles.ragged_mqa_logits import ragged_mqa_logits


class OracleRagged:
    """The float64 oracle rounded to float32, window-relative, -inf past each window: a right answer."""

    name = "planted-right-ragged"
    contract = RaggedContract(form=LogitsForm.WINDOW_RELATIVE, mask=MaskConvention.TAIL_NEG_INF, library="test")
    early = 0  # keys the mask starts early by

    def unavailable_reason(self, device: str) -> str | None:
        return None

    def __call__(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        q = inputs.q.to(torch.float64)
        logits = ragged_mqa_logits(q, inputs.k, inputs.k_scale, inputs.weights, inputs.k_start.long(),
                                   inputs.k_end.long(), inputs.width).to(torch.float32)
        if self.early:
            lens = (inputs.k_end - inputs.k_start).long()
            rows = torch.nonzero(lens >= 2).flatten()
            logits[rows, (lens[rows] - self.early).clamp(max=inputs.width - 1)] = -math.inf
        return logits


class EarlyMaskRagged(OracleRagged):
    """The mask starts one key early: the last key of each window of two or more is -inf."""

    name = "planted-early-mask-ragged"
    early = 1


class WholeRowTopk:
    """torch.topk over the whole row: indices outside the window whenever a larger value lies outside it."""

    name = "planted-whole-row-topk"
    contract = TopkContract(index=IndexConvention.ABSOLUTE, padding=TopkPadding.PAST_CANDIDATES,
                            window=WindowForm.STARTS_ENDS, nan=NanRanking.HIGHEST, library="test")

    def unavailable_reason(self, device: str) -> str | None:
        return None

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        k = min(inputs.k, inputs.logits.shape[1])
        picked = torch.topk(inputs.logits, k, dim=1).indices.to(torch.int32)
        return torch.cat([picked, picked.new_full((inputs.rows, inputs.k - k), -1)], dim=1)


class WrongAfterFirstTopk:
    """torch-topk on its first launch; every later launch puts row 0's first pick in its second slot too (a race
    on the output): nondeterministic, and wrong."""

    name = "planted-wrong-after-first-topk"

    def __init__(self):
        from difftest.backends.torch_topk import TorchTopk

        self.right, self.contract, self.launches = TorchTopk(), TorchTopk.contract, 0

    def unavailable_reason(self, device: str) -> str | None:
        return None

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        got = self.right(inputs, out)
        self.launches += 1
        if self.launches > 1:
            got[0, 1] = got[0, 0]
        return got
