"""Row-by-row judgement of a ragged logits kernel against the oracle, under its contract: the kernel's output
mapped onto the oracle's window-relative frame, then judged by the paged comparison's machinery
(difftest.engine.comparison.compare), unchanged.

In the window-relative frame row i's window is its first k_end[i] - k_start[i] positions, exactly as a paged
row's window is its first `length` positions, so every rule carries over: inside the window every value
finite and within max(rtol * row scale, the oracle's bound); under TAIL_NEG_INF -inf at every other position;
NaN, poison (unwritten), a -inf inside or a finite value outside named as in paged logits, the wrong -inf mask
the headline.

How each output form maps (docs/reference/ragged.md):
* WINDOW_RELATIVE ([rows, max_seqlen_k], column j = key k_start + j): it is the frame already, read through
  its strides (DeepGEMM returns a row-padded view). Columns past the window are the tail.
* ABSOLUTE ([rows, keys], column p = key p): each row rotated left by its k_start, so position j holds key
  (k_start + j) mod keys. The window comes first, then the keys after it, then those before it: every column
  outside the window lands in the tail, where TAIL_NEG_INF checks it. Positions a report names are turned
  back into keys (RaggedComparison.key_of).
"""

from __future__ import annotations

import dataclasses

import torch

from difftest.core.contract import Contract
from difftest.core.kinds import CacheLayout, LengthEncoding, LogitsForm
from difftest.core.poison import bits
from difftest.core.ragged import RaggedCase, RaggedContract
from difftest.core.verdict import Verdict
from difftest.engine.comparison import CHUNK_ELEMENTS, Comparison, compare
from difftest.oracles.ragged_reference import RaggedReference


@dataclasses.dataclass(frozen=True)
class RaggedComparison:
    """A Comparison in the window-relative frame, and what turns its positions back into keys."""

    comparison: Comparison  # position j of row i is key k_start[i] + j (mod keys under ABSOLUTE)
    form: LogitsForm
    k_start: tuple[int, ...]
    k_end: tuple[int, ...]
    keys: int

    @property
    def verdict(self) -> Verdict:
        """The comparison's verdict: its worst kind of wrong row, PASS when there is none."""
        return self.comparison.verdict

    def key_of(self, row: int, position: int) -> int:
        """The key a frame position of `row` stands for."""
        key = self.k_start[row] + position
        return key % self.keys if self.form == LogitsForm.ABSOLUTE else key

    def headline(self) -> str:
        """'2/12 rows with a wrong -inf mask, 0 NaN, 0 unwritten, 1 off in value; first: row 3 key 130
        (window [10, 130)): FAIL(mask), expected -inf, got 0.25'."""
        c = self.comparison
        text = (f"{len(c.mask_rows)}/{c.rows} rows with a wrong -inf mask, {len(c.nan_rows)} NaN, "
                f"{len(c.unwritten_rows)} unwritten, {len(c.value_rows)} off in value")
        first = c.first_mismatch
        if first is None:
            return text
        window = f"[{self.k_start[first.row]}, {self.k_end[first.row]})"
        return (f"{text}; first: row {first.row} key {self.key_of(first.row, first.position)} (window {window}): "
                f"{first.kind.value}, expected {first.expected:g}, got {first.got:g}")


def compare_ragged(reference: RaggedReference, got: torch.Tensor, case: RaggedCase,
                   contract: RaggedContract) -> RaggedComparison:
    """Judge `got` (the kernel's output in its contract's form, any strides) for `case`; `reference` is the
    oracle's answer at the contract's width (make_ragged_reference(case, contract.width(case))).
    ValueError when the output has the wrong shape."""
    width = contract.width(case)
    if tuple(got.shape) != (case.rows, width):
        raise ValueError(f"backend returned logits of shape {tuple(got.shape)}, expected {(case.rows, width)} "
                         f"({contract.form.value})")
    if tuple(reference.logits.shape) != (case.rows, width):
        raise ValueError(f"the oracle's logits have shape {tuple(reference.logits.shape)}, the contract's output "
                         f"{(case.rows, width)}")
    frame = got if contract.form == LogitsForm.WINDOW_RELATIVE else rotated(got, case.k_start)
    judged = compare(reference.logits, frame, reference.window_lens, _rules(contract), bound=reference.bound)
    return RaggedComparison(judged, contract.form, tuple(case.k_start.tolist()), tuple(case.k_end.tolist()),
                            case.keys)


def rotated(got: torch.Tensor, k_start: torch.Tensor) -> torch.Tensor:
    """[rows, keys] with row i rotated left by k_start[i]: position j holds got[i, (k_start[i] + j) mod keys].
    Moved as same-width integers, so NaN payloads (the poison of unwritten positions) survive bit for bit;
    a few rows at a time, so the index stays small beside a 2^31-element output."""
    rows, keys = got.shape
    raw = bits(got)
    out = torch.empty((rows, keys), dtype=raw.dtype, device=got.device)
    columns = torch.arange(keys, device=got.device)
    step = max(1, CHUNK_ELEMENTS // max(keys, 1))
    for first in range(0, rows, step):
        starts = k_start[first:first + step].to(got.device)
        out[first:first + step] = raw[first:first + step].gather(1, (starts[:, None] + columns) % keys)
    return out.view(got.dtype)


def _rules(contract: RaggedContract) -> Contract:
    """The paged Contract compare() judges by: it reads a contract's mask convention and rtol, nothing else
    (the encoding and layout given here are never read)."""
    return Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, contract.mask, rtol=contract.rtol)
