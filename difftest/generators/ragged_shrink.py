"""Shrink a failing ragged logits case: deterministic, time-bounded reduction of its tensors.

`still_fails(candidate)` says whether a smaller case fails the way the original did (the caller's judgement:
the same verdict of the same backend); a candidate is kept only when it does. Each round tries, in order:

1. fewer rows: halves, then quarters, ..., then single rows;
2. fewer keys: those past every window's end, those before every window's start, then blocks of keys (halves
   down to 1/64 of the buffer) cut out of it, windows moved with them (and shortened where the cut is theirs);
3. smaller windows: each row's window halved from its end, then from its start;
4. simpler values: every scale 1.0, weights their signs, q and keys rounded to integers in [-4, 4] (exact in
   either fp8 flavour), max_seqlen_k dropped (the longest window).

Each move is repeated on its own result until it finds nothing more; candidates that are no valid case (a cut
that uncovers a NaN canary, say) or that the contract cannot take are not tried. Rounds repeat until one
changes nothing or the budget is spent. Works on any RaggedCase (a golden file, a bundle's): it reads no spec.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator

import torch

from difftest.core.errors import SpecError
from difftest.core.fp8 import decode, encode_exact
from difftest.core.ragged import RaggedCase, RaggedContract
from difftest.generators.greedy_shrink import Shrunk, shrink_greedily

_FINEST_CUT = 64  # the narrowest block of keys tried is keys / this


def shrink_ragged(case: RaggedCase, still_fails: Callable[[RaggedCase], bool], contract: RaggedContract | None = None,
                  budget_seconds: float = 20.0, max_probes: int | None = None) -> Shrunk[RaggedCase]:
    """The smallest case `still_fails` accepts, reached from `case` within about `budget_seconds` and at most
    `max_probes` calls of `still_fails` (None: any number); SpecError when `case` itself does not fail."""
    moves = (_fewer_rows, _fewer_keys, _smaller_windows, _simpler)
    return shrink_greedily(case, still_fails, moves, functools.partial(_takes, contract), budget_seconds,
                           max_probes)


def _takes(contract: RaggedContract | None, case: RaggedCase) -> bool:
    """Whether `case` is a case at all that the contract takes (on any of its devices)."""
    try:
        case.validate()
    except SpecError:
        return False
    if contract is None:
        return True
    return contract.shape_reason(case.rows, case.keys, case.heads, case.head_dim) is None and \
        contract.window_reason(case) is None


def _fewer_rows(case: RaggedCase) -> Iterator[RaggedCase]:
    """Halves, quarters, ... then single rows, first ones first."""
    size = case.rows // 2
    while size >= 1:
        for first in range(0, case.rows, size):
            kept = torch.arange(first, min(first + size, case.rows), device=case.device)
            if len(kept) < case.rows:
                yield _rows(case, kept)
        size //= 2


def _rows(case: RaggedCase, keep: torch.Tensor) -> RaggedCase:
    return dataclasses.replace(case, q=case.q[keep], weights=case.weights[keep], k_start=case.k_start[keep],
                               k_end=case.k_end[keep])


def _fewer_keys(case: RaggedCase) -> Iterator[RaggedCase]:
    """The keys past every window's end cut, those before every window's start, then blocks inside."""
    last, first = max(int(case.k_end.max()), 1), int(case.k_start.min())  # a case keeps one key at least
    if last < case.keys:
        yield _cut(case, last, case.keys)
    if first > 0:
        yield _cut(case, 0, first)
    block = case.keys // 2
    while block >= max(1, case.keys // _FINEST_CUT):
        for lo in range(0, case.keys - block + 1, block):
            yield _cut(case, lo, lo + block)
        block //= 2


def _cut(case: RaggedCase, lo: int, hi: int) -> RaggedCase:
    """The case without keys [lo, hi): later keys move down, windows with them (shortened where they held the cut)."""
    keep = torch.cat([torch.arange(lo, device=case.device), torch.arange(hi, case.keys, device=case.device)])
    shift = lambda x: torch.where(x >= hi, x - (hi - lo), torch.clamp(x, max=lo))  # noqa: E731
    return dataclasses.replace(case, k=case.k[keep], k_scale=case.k_scale[keep], k_start=shift(case.k_start),
                               k_end=shift(case.k_end))


def _smaller_windows(case: RaggedCase) -> Iterator[RaggedCase]:
    """Each row's window halved from its end, then from its start (rows with a window of at least one key)."""
    lens = case.window_lens()
    for row in torch.nonzero(lens > 0).flatten().tolist():
        half = int(lens[row]) // 2
        for field, value in (("k_end", case.k_start[row] + half), ("k_start", case.k_end[row] - half)):
            windows = getattr(case, field).clone()
            windows[row] = value
            yield dataclasses.replace(case, **{field: windows})


def _simpler(case: RaggedCase) -> Iterator[RaggedCase]:
    """Scales 1.0; weights their signs; q and keys rounded to integers in [-4, 4]; no max_seqlen_k."""
    ones = torch.where(torch.isnan(case.k_scale), case.k_scale, 1.0)  # canaries stay NaN
    if not torch.equal(ones.nan_to_num(), case.k_scale.nan_to_num()):
        yield dataclasses.replace(case, k_scale=ones)
    signs = torch.sign(case.weights)
    if not torch.equal(signs, case.weights):
        yield dataclasses.replace(case, weights=signs)
    q, k = _rounded(case.q, case), _rounded(case.k, case)
    if not (torch.equal(q, case.q) and torch.equal(k, case.k)):
        yield dataclasses.replace(case, q=q, k=k)
    if case.max_seqlen_k is not None:
        yield dataclasses.replace(case, max_seqlen_k=None)


def _rounded(raw: torch.Tensor, case: RaggedCase) -> torch.Tensor:
    """fp8 bytes of the values rounded to integers in [-4, 4] (NaN bytes kept)."""
    values = decode(raw, case.fp8, torch.float32)
    nan = torch.isnan(values)
    out = encode_exact(values.round().clamp(-4, 4).nan_to_num(0.0), case.fp8, "q")
    return torch.where(nan, raw, out)
