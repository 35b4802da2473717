"""Planted top-k bugs of the values and row orders real kernels meet (issue 42): a +inf that is never ranked,
a tie surplus stored into the next row's slots. Each starts from SGLang's torch reference
(difftest.backends.torch_topk.TorchTopk: row-relative indices, -1 past the candidates, descending order) and
breaks one thing; each is a class, so a test registers it in a backend table under its `name`.
"""

from __future__ import annotations

import math

import torch

from difftest.backends.torch_topk import TorchTopk
from difftest.core.topk import TopkInputs
from tests.planted_topk import CONTRACT, _values_of


class _Planted:
    """What the planted backends share: the torch reference's contract on the CPU."""

    contract = CONTRACT

    def unavailable_reason(self, device: str) -> str | None:
        """CPU only."""
        return None if device == "cpu" else "planted bugs run on the CPU"


class DropsPosInf(_Planted):
    """+inf ranked as -inf (a float-to-key map that sends +inf below every finite key): a row's +inf positions
    are never picked, the -1 pads come early. FAIL(padding) or FAIL(missing) wherever a window holds a +inf."""

    name = "planted-drops-pos-inf"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The right answer of the logits with every +inf made -inf."""
        logits = inputs.logits.masked_fill(torch.isposinf(inputs.logits), -math.inf)
        return TorchTopk()(_with_logits(inputs, logits), None)


class SpillsTies(_Planted):
    """A row's surplus tie (a column equal to its k-th value that it does not pick) stored into the next row's
    last slot after that row wrote its own, where the next row's k-th value is tied too (the tie list the
    surplus lands in is the next row's: sglang#35257's shape, across rows). Seen only on adjacent rows that
    both carry a tie at the k-th value: FAIL(missing) or FAIL(duplicate) on the second."""

    name = "planted-spills-ties"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The right answer with each row's first surplus tie written over the next row's last slot."""
        right = TorchTopk()(inputs, None)
        values = _values_of(inputs, right)
        spilled = right.clone()
        for row in range(right.shape[0] - 1):
            surplus = _surplus_tie(inputs, right, values, row)
            if surplus is not None and _tied_at_kth(inputs, right, values, row + 1):
                spilled[row + 1, -1] = surplus
        return spilled


def _with_logits(inputs: TopkInputs, logits: torch.Tensor) -> TopkInputs:
    return TopkInputs(logits, inputs.k, inputs.form, inputs.row_starts, inputs.row_ends, inputs.lengths,
                      inputs.seq_lens, inputs.next_n)


def _window(inputs: TopkInputs, row: int) -> torch.Tensor:
    starts, ends = inputs.windows()
    return inputs.logits[row, int(starts[row]):int(ends[row])]


def _kth(values: torch.Tensor, right: torch.Tensor, row: int) -> float | None:
    """The smallest value row `row` picked (its k-th), None when it picked none."""
    picked = values[row][right[row] >= 0]
    return float(picked.min()) if picked.numel() else None


def _surplus_tie(inputs: TopkInputs, right: torch.Tensor, values: torch.Tensor, row: int) -> int | None:
    """The row-relative index of the first column equal to the row's k-th value that it did not pick."""
    kth = _kth(values, right, row)
    if kth is None:
        return None
    picked = set(right[row].tolist())
    left = [c for c in torch.nonzero(_window(inputs, row) == kth).flatten().tolist() if c not in picked]
    return left[0] if left else None


def _tied_at_kth(inputs: TopkInputs, right: torch.Tensor, values: torch.Tensor, row: int) -> bool:
    """Whether the row's window holds its k-th value twice or more."""
    kth = _kth(values, right, row)
    return kth is not None and int((_window(inputs, row) == kth).sum()) > 1
