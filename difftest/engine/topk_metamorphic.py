"""Metamorphic relations of the top-k operation: checks of a top-k kernel that need no oracle, so they run
where none fits (rows of a million columns, a kernel with no reference yet).

A relation (difftest.core.kinds.TopkRelation) turns a case into a related case whose answer follows from the
case's:

* add-neg-inf: ADDED -inf entries inserted at the end of every window (the window grows over them, the columns
  after it move right, the row stride grows by as much): no candidate changes, so the same candidates are
  chosen, and the pads follow the contract's padding rule for the longer window (past-candidates: unchanged;
  past-window: fewer by what the window gained, up to k; outside-columns: none either way);
* permute-columns: each row's window shuffled in place: the same values, so the same ones chosen, and the
  same pads.

Either holds, row by row, when the values of the slots that name a candidate of the window (read through the
contract's index convention; -inf and columns outside the window are no candidates) are the same multiset in
both answers (any choice among ties is as good), and the pads (-1 slots) are as the rule says. The related
case is derived from the case alone (its random choices from a fixed seed), so the case and the relation's
name draw the pair again.

`relate` is what the operation runner calls on a result that ran (`RunConfig.metamorphic`; the related cases
launched where the backend runs, a violation FAIL(metamorphic)); `check` is the same from Python, in-process.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from difftest.backends.topk_base import TopkBackend
from difftest.core import memory
from difftest.core.errors import require
from difftest.core.kinds import IndexConvention, TopkPadding, TopkRelation
from difftest.core.topk import TopkCase, TopkContract, encode_topk
from difftest.engine.guards import Fault
from difftest.engine.isolate import Called
from difftest.engine.result import TopkViolation
from difftest.oracles.topk import rank_to_value, rank_values

SEED = 20261205  # the relations' random choices
ADDED = 16  # -inf entries add-neg-inf inserts into every window

Launch = Callable[[TopkCase], Called | Fault]  # the backend on a case, where it runs


@dataclasses.dataclass(frozen=True)
class TopkRelated:
    """A case changed by a relation, and how many columns each row's window gained."""

    relation: TopkRelation
    case: TopkCase
    gained: torch.Tensor  # int64 [rows]


def related(case: TopkCase, relation: TopkRelation) -> TopkRelated | None:
    """`case` changed by `relation`; None where it changes nothing (no window to shuffle)."""
    generator = torch.Generator().manual_seed(SEED + list(TopkRelation).index(relation))
    return _TRANSFORMS[relation](case, generator)


def check(backend: TopkBackend, case: TopkCase, relations: Sequence[TopkRelation]) -> tuple[TopkViolation, ...]:
    """The relations `backend` does not keep on `case`, the case and each related case it takes launched once in
    this process (an exception the backend raises propagates)."""
    contract = backend.contract
    answer = backend(encode_topk(case, contract), None)
    return relate(case, answer, contract, relations, lambda other: Called(backend(encode_topk(other, contract), None),
                                                                           0.0))


def relate(case: TopkCase, answer: torch.Tensor, contract: TopkContract, relations: Sequence[TopkRelation],
           launch: Launch) -> tuple[TopkViolation, ...]:
    """The relations that do not hold for a backend whose answer on `case` is `answer`, each related case the
    contract takes run through `launch` once; a related case it cannot take, or whose call ran out of memory,
    relates nothing."""
    require(all(isinstance(r, TopkRelation) for r in relations), "metamorphic", tuple(relations),
            f"relations of the topk operation: {[r.value for r in TopkRelation]}")
    violations = []
    for relation in relations:
        change = related(case, relation)
        if change is None or contract.accepts(change.case, str(case.device.type)) is not None:
            continue
        violation = _related_answer(case, answer, change, launch(change.case), contract)
        violations += [violation] if violation is not None else []
    return tuple(violations)


def _related_answer(case: TopkCase, answer: torch.Tensor, change: TopkRelated, called: Called | Fault,
                    contract: TopkContract) -> TopkViolation | None:
    """Whether the backend's call on the related case follows from `answer`: judged when it answered in shape;
    a violation saying so when it did not answer (raised, crashed, hung) or answered another shape."""
    if isinstance(called, Fault):
        if memory.is_out_of_memory(called.error_type, called.reason):
            return None  # no verdict for want of memory, as on a case
        return _unanswered(change, f"{called.verdict.value} on the related case: {called.reason.partition(chr(10))[0]}")
    got = called.output
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (case.rows, case.k):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return _unanswered(change, f"indices of shape {shape} on the related case, expected {(case.rows, case.k)}")
    return judge(case, answer, change, got, contract)


def _unanswered(change: TopkRelated, why: str) -> TopkViolation:
    """The violation of a related case the backend gave no answer on, though it gave one on the case."""
    return TopkViolation(change.relation, change.case.name, (), 0, (), (), 0, 0, 0, why)


def judge(case: TopkCase, answer: torch.Tensor, change: TopkRelated, related_answer: torch.Tensor,
          contract: TopkContract) -> TopkViolation | None:
    """Whether `related_answer` (on change.case) follows from `answer` (on `case`) as the relation says."""
    chosen, pads = _chosen(case, answer, contract)
    related_chosen, related_pads = _chosen(change.case, related_answer, contract)
    expected = pads - _pads_lost(case, change, contract)
    same = (chosen == related_chosen).all(dim=1) & (related_pads == expected)
    rows = torch.nonzero(~same).flatten().tolist()
    if not rows:
        return None
    row = rows[0]
    values = [tuple(rank_to_value(c[row][c[row] > -math.inf]).tolist()) for c in (chosen, related_chosen)]
    return TopkViolation(change.relation, change.case.name, tuple(rows), row, values[0], values[1], int(pads[row]),
                         int(related_pads[row]), int(expected[row]))


def _chosen(case: TopkCase, answer: torch.Tensor, contract: TopkContract) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 [rows, k] the ranks of the candidates the answer's slots name, descending, -inf where a slot
    names none; int64 [rows] its -1 slots)."""
    index = answer.to(case.device, torch.int64)
    column = index + case.starts[:, None] if contract.index == IndexConvention.ROW_RELATIVE else index
    named = (index != -1) & (column >= case.starts[:, None]) & (column < case.ends[:, None])
    ranks = rank_values(case.logits, contract.nan).gather(1, column.clamp(0, case.width - 1))
    chosen = torch.where(named, ranks, -math.inf).sort(dim=1, descending=True).values
    return chosen, (index == -1).sum(dim=1)


def _pads_lost(case: TopkCase, change: TopkRelated, contract: TopkContract) -> torch.Tensor:
    """int64 [rows]: the pads the contract's rule takes away on the related case (past-window: the window's
    gain up to k; otherwise none)."""
    if contract.padding != TopkPadding.PAST_WINDOW:
        return torch.zeros_like(change.gained)
    length = case.window_lens()
    return (length + change.gained).clamp(max=case.k) - length.clamp(max=case.k)


def _derived(case: TopkCase, relation: TopkRelation, storage: torch.Tensor, width: int, ends: torch.Tensor) -> TopkCase:
    """A related case: its memory, width and window ends, named '<case>~<relation>', no longer the spec's draw."""
    meta = {key: value for key, value in case.meta.items() if key not in ("spec", "seed")}
    return dataclasses.replace(case, name=f"{case.name}~{relation.value}", storage=storage, width=width, ends=ends,
                               meta=meta).validate()


def _add_neg_inf(case: TopkCase, generator: torch.Generator) -> TopkRelated:
    """ADDED -inf columns at the end of every window; the stride padding past the width kept as it was."""
    rows, width = case.rows, case.width
    columns = torch.arange(width + ADDED, device=case.device)[None, :]
    ends = case.ends[:, None]
    source = torch.where(columns < ends, columns, columns - ADDED).clamp(0, width - 1)
    logits = case.logits.gather(1, source.expand(rows, -1))
    logits = torch.where((columns >= ends) & (columns < ends + ADDED), -math.inf, logits)
    storage = torch.cat([logits, case.storage[:, width:]], dim=1).contiguous()
    gained = torch.full((rows,), ADDED, dtype=torch.int64, device=case.device)
    return TopkRelated(TopkRelation.ADD_NEG_INF, _derived(case, TopkRelation.ADD_NEG_INF, storage, width + ADDED,
                                                          case.ends + ADDED), gained)


def _permute_columns(case: TopkCase, generator: torch.Generator) -> TopkRelated | None:
    """Each window's columns in a random order: sorting keys start + U[0, 1) inside the window and the column's
    own index outside it puts the window's columns, shuffled, between those before and after it."""
    if not bool((case.window_lens() > 1).any()):
        return None
    columns = torch.arange(case.width, device=case.device)[None, :]
    inside = (columns >= case.starts[:, None]) & (columns < case.ends[:, None])
    noise = torch.rand(case.rows, case.width, generator=generator).to(case.device)
    keys = torch.where(inside, case.starts[:, None].double() + noise.double(), columns.double())
    order = keys.argsort(dim=1)
    storage = case.storage.clone()
    storage[:, :case.width] = case.logits.gather(1, order)
    return TopkRelated(TopkRelation.PERMUTE_COLUMNS, _derived(case, TopkRelation.PERMUTE_COLUMNS, storage,
                                                              case.width, case.ends),
                       torch.zeros(case.rows, dtype=torch.int64, device=case.device))


_TRANSFORMS: dict[TopkRelation, Callable[[TopkCase, torch.Generator], TopkRelated | None]] = {
    TopkRelation.ADD_NEG_INF: _add_neg_inf, TopkRelation.PERMUTE_COLUMNS: _permute_columns}
