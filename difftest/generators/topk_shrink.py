"""Shrink a failing top-k case: deterministic, time-bounded reduction of its tensors.

`still_fails(candidate)` says whether a smaller case fails the way the original did (the caller's judgement:
the same verdict of the same backend); a candidate is kept only when it does. Each round tries, in order:

1. drop rows: halves, then quarters, ..., then single rows (whole requests of next_n rows);
2. narrow the rows: columns past the last window's end, then before the first window's start, then blocks
   of columns (halves down to 1/64 of the width) cut out of every row, windows moved with them;
3. smaller k: the contract's smaller ks (where it takes any: k - k/2, k - k/4, ..., k - 1);
4. simpler values: each row's values replaced by their rank among the distinct values of the row (small
   integers, same order, same ties); -inf outside the windows; contiguous rows.

Each move is repeated on its own result until it finds nothing more; candidates the contract cannot take
are not tried. Rounds repeat until one changes nothing or the budget is spent. Works on any TopkCase (a
golden file, a bundle's): it reads no spec.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator

import torch

from difftest.core.errors import SpecError
from difftest.core.topk import TopkCase, TopkContract
from difftest.generators.greedy_shrink import Shrunk, shrink_greedily

_FINEST_CUT = 64  # the narrowest block of columns tried is width / this


def shrink_topk(case: TopkCase, still_fails: Callable[[TopkCase], bool], contract: TopkContract | None = None,
                budget_seconds: float = 20.0, max_probes: int | None = None) -> Shrunk[TopkCase]:
    """The smallest case `still_fails` accepts, reached from `case` within about `budget_seconds` and at most
    `max_probes` calls of `still_fails` (None: any number); SpecError when `case` itself does not fail."""
    moves = [functools.partial(_contracted, move, contract) for move in (_fewer_rows, _narrower, _smaller_k, _simpler)]
    return shrink_greedily(case, still_fails, moves, functools.partial(_takes, contract), budget_seconds,
                           max_probes)


def _contracted(move: Callable[[TopkCase, TopkContract | None], Iterator[TopkCase]], contract: TopkContract | None,
                case: TopkCase) -> Iterator[TopkCase]:
    return move(case, contract)


def _takes(contract: TopkContract | None, case: TopkCase) -> bool:
    """Whether `case` is a case at all (a cut may leave no column) that the contract takes."""
    try:
        case.validate()
    except SpecError:
        return False
    if contract is None:
        return True
    return contract.shape_reason(case.rows, case.width, case.row_stride, case.k) is None and \
        contract.window_reason(case) is None


def _rows(case: TopkCase, keep: torch.Tensor) -> TopkCase:
    """The case with only the rows `keep` (int64 indices)."""
    return dataclasses.replace(case, storage=case.storage[keep].contiguous(), starts=case.starts[keep],
                               ends=case.ends[keep])


def _fewer_rows(case: TopkCase, contract: TopkContract | None) -> Iterator[TopkCase]:
    """Halves, quarters, ... then single requests (next_n rows each), first ones first."""
    requests = case.rows // case.next_n
    size = requests // 2
    while size >= 1:
        for first in range(0, requests, size):
            kept = torch.arange(first * case.next_n, min(first + size, requests) * case.next_n, device=case.device)
            if len(kept) < case.rows:
                yield _rows(case, kept)
        size //= 2


def _narrower(case: TopkCase, contract: TopkContract | None) -> Iterator[TopkCase]:
    """The columns past every window's end cut, those before every window's start, then blocks inside."""
    last, first = int(case.ends.max()), int(case.starts.min())
    if last < case.width:
        yield _cut(case, last, case.width)
    if first > 0:
        yield _cut(case, 0, first)
    block = case.width // 2
    while block >= max(1, case.width // _FINEST_CUT):
        for lo in range(0, case.width - block + 1, block):
            yield _cut(case, lo, lo + block)
        block //= 2


def _cut(case: TopkCase, lo: int, hi: int) -> TopkCase:
    """The case without columns [lo, hi) of every row: later columns move left, windows with them; the stride
    padding past the width keeps its size."""
    keep = torch.cat([torch.arange(lo, device=case.device), torch.arange(hi, case.row_stride, device=case.device)])
    shift = lambda x: torch.where(x >= hi, x - (hi - lo), torch.clamp(x, max=lo))  # noqa: E731
    return dataclasses.replace(case, storage=case.storage[:, keep].contiguous(), width=case.width - (hi - lo),
                               starts=shift(case.starts), ends=shift(case.ends))


def _smaller_k(case: TopkCase, contract: TopkContract | None) -> Iterator[TopkCase]:
    """The contract's smaller ks, largest first; where it takes any k: halved first, then smaller steps down."""
    if contract is not None and contract.ks is not None:
        smaller = sorted((k for k in contract.ks if k < case.k), reverse=True)
    else:  # k // 2, then ever smaller steps down: k - k // 4, k - k // 8, ..., k - 1 (a binary search's probes)
        steps = [case.k // 2 ** i for i in range(1, int(math.log2(case.k)) + 1)]
        smaller = [case.k - step for step in steps] + [case.k - 1]
    for k in dict.fromkeys(k for k in smaller if k >= 1):
        yield dataclasses.replace(case, k=k)


def _simpler(case: TopkCase, contract: TopkContract | None) -> Iterator[TopkCase]:
    """Ranks instead of values; -inf outside the windows; contiguous rows."""
    logits = case.logits
    ranked = torch.where(torch.isfinite(logits), _dense_ranks(logits), logits)
    if not _same(ranked, logits):
        yield _with_logits(case, ranked)
    columns = torch.arange(case.width, device=case.device)
    inside = (columns >= case.starts[:, None]) & (columns < case.ends[:, None])
    cleaned = torch.where(inside, logits, -math.inf)
    if not _same(cleaned, logits):
        yield _with_logits(case, cleaned)
    if case.row_stride != case.width:
        yield dataclasses.replace(case, storage=case.logits.contiguous())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN equal to NaN (torch.equal says a tensor holding NaN differs from itself)."""
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _dense_ranks(logits: torch.Tensor) -> torch.Tensor:
    """float32 [rows, width]: each finite value's rank among the distinct finite values of its row (0, 1, ...)."""
    finite = torch.where(torch.isfinite(logits), logits, math.inf)
    ordered = finite.sort(dim=1).values
    new = torch.ones_like(ordered, dtype=torch.int64)
    new[:, 1:] = (ordered[:, 1:] != ordered[:, :-1]).long()
    ranks_sorted = new.cumsum(dim=1) - 1
    position = torch.searchsorted(ordered, finite.contiguous())
    return ranks_sorted.gather(1, position.clamp(max=logits.shape[1] - 1)).float()


def _with_logits(case: TopkCase, logits: torch.Tensor) -> TopkCase:
    storage = case.storage.clone()
    storage[:, :case.width] = logits
    return dataclasses.replace(case, storage=storage)
