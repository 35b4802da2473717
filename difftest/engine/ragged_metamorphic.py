"""Metamorphic relations of the ragged (prefill) logits operation: checks of a ragged logits kernel that need no
oracle, so they run where none fits (a 128K-key prefill, a kernel with no reference yet).

A relation (difftest.core.kinds.RaggedRelation) turns a case into related cases whose logits follow from the
case's:

* shift-keys: SHIFT keys (3: odd, so no multiple of 4 nor of any tile) inserted before the key buffer, NaN
  canaries as the generators make the keys no window holds, every window moved right with its keys: an ABSOLUTE
  row's logits move SHIFT columns right (the SHIFT new columns lie outside every window), a WINDOW_RELATIVE row
  is unchanged. A kernel whose tiles are anchored to key 0 rather than to the window (AITER 0.1.7's) answers
  otherwise;
* permute-rows: the rows shuffled with their q, weights and windows: the rows of the logits move alike;
* scale-q: q times 2 where every |q| <= Q_SCALED_MAX (its double is then an e4m3 value of both flavours, so
  any backend's flavour holds it), else the weights times 2 (fp32: exact): every logit doubles (a power of two
  commutes with every rounding while nothing overflows), so no accumulator starts off zero, nothing clamps;
* permute-heads: the heads shuffled with their weights: the same head sum, in another order;
* append-keys: APPENDED keys (finite, with positive scales) after the buffer's end, no window reaching them:
  every window's logits unchanged; an ABSOLUTE row grows by APPENDED columns, outside every window;
* split-rows: the first half of the rows and the second in two launches, each at the case's max_seqlen_k: their
  rows, laid end to end, are the case's.

Each related case is derived from the case alone (its random choices from a fixed seed per relation) and named
'<case>~<relation>' (split-rows: '-1of2' and '-2of2' after it), so the case and the relation's name draw the
pair again. Judged row by row in the contract's output form: inside every window, and under TAIL_NEG_INF at
every other column too, where a column of the related output that follows from no column of the case's (the
inserted or appended keys') must be -inf; within the contract's rtol of the row's largest finite |logit| over
the columns judged (a related launch may take another schedule or sum in another order;
difftest.engine.metamorphic.agrees). A -inf where a finite value belongs, or the reverse, is wrong either way.

`relate` is what the operation runner calls on a result that ran (`RunConfig.metamorphic`; the related cases
launched where the backend runs, a violation FAIL(metamorphic)); `check` is the same from Python, in-process.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from difftest.backends.ragged_base import RaggedBackend
from difftest.core import memory
from difftest.core.errors import SpecError, require
from difftest.core.fp8 import encode_exact
from difftest.core.kinds import LogitsForm, MaskConvention, RaggedRelation
from difftest.core.ragged import MAX_KEYS, RaggedCase, RaggedContract, encode_ragged
from difftest.engine.guards import Fault
from difftest.engine.isolate import Called
from difftest.engine.metamorphic import CHUNK_ELEMENTS, Q_SCALED_MAX, ROWS_KEPT, agrees, finite_keys, shuffle
from difftest.engine.result import RaggedViolation

SEED = 20261206  # each relation's random choices: SEED + its place in RaggedRelation
SHIFTS = (3, 1)  # keys shift-keys inserts: the first that keeps the buffer within MAX_KEYS (odd either way)
APPENDED = 37  # keys append-keys adds: odd, no tile's multiple, so the buffer's length changes its residues

Launch = Callable[[RaggedCase], Called | Fault]  # the backend on a case, where it runs


@dataclasses.dataclass(frozen=True)
class RaggedRelated:
    """A case changed by a relation: the related cases, and how their logits follow from the case's."""

    relation: RaggedRelation
    cases: tuple[RaggedCase, ...]  # launched in turn; their outputs laid end to end (by rows)
    rows: torch.Tensor  # int64 [case rows]: the row of those outputs each row of the case moved to
    shift: int = 0  # keys every window moved right by: an ABSOLUTE row's columns move as far
    scale: float = 1.0  # related logit = scale * the case's logit
    note: str = ""  # how it was made


def related(case: RaggedCase, relation: RaggedRelation) -> RaggedRelated | None:
    """`case` changed by `relation`; None where the relation changes nothing here (one row to permute or split,
    one head to permute, no room left under MAX_KEYS, weights whose double overflows)."""
    generator = torch.Generator().manual_seed(SEED + list(RaggedRelation).index(relation))
    return _TRANSFORMS[relation](case, generator)


def check(backend: RaggedBackend, case: RaggedCase,
          relations: Sequence[RaggedRelation]) -> tuple[RaggedViolation, ...]:
    """The relations `backend` does not keep on `case`, the case and each related case its contract takes
    launched once in this process (an exception the backend raises propagates)."""
    contract = backend.contract
    answer = backend(encode_ragged(case, contract), None)
    return relate(case, answer, contract, relations,
                  lambda other: Called(backend(encode_ragged(other, contract), None), 0.0))


def relate(case: RaggedCase, answer: torch.Tensor, contract: RaggedContract, relations: Sequence[RaggedRelation],
           launch: Launch) -> tuple[RaggedViolation, ...]:
    """The relations that do not hold for a backend whose logits on `case` are `answer` (in the contract's form),
    each related case run through `launch` once; a relation whose related cases the contract does not all take,
    or whose call ran out of memory, relates nothing."""
    require(all(isinstance(r, RaggedRelation) for r in relations), "metamorphic", tuple(r.value for r in relations),
            f"relations of the ragged-logits operation: {[r.value for r in RaggedRelation]}")
    device = str(case.device.type)
    violations = []
    for relation in relations:
        change = related(case, relation)
        if change is None or any(contract.accepts(other, device) is not None for other in change.cases):
            continue
        violation = _related_answer(case, answer, change, contract, launch)
        violations += [violation] if violation is not None else []
    return tuple(violations)


def _related_answer(case: RaggedCase, answer: torch.Tensor, change: RaggedRelated, contract: RaggedContract,
                    launch: Launch) -> RaggedViolation | None:
    """Whether the backend's answers on the related cases follow from `answer`: judged when each came in shape; a
    violation saying so when one did not come (raised, crashed, hung) or came in another shape."""
    outputs = []
    for other in change.cases:
        called = launch(other)
        if isinstance(called, Fault):
            if memory.is_out_of_memory(called.error_type, called.reason):
                return None  # no verdict for want of memory, as on a case
            return _unanswered(change, contract, f"{called.verdict.value} on {other.name}: "
                                                 f"{called.reason.partition(chr(10))[0]}")
        got, shape = called.output, (other.rows, contract.width(other))
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
            found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return _unanswered(change, contract, f"logits of shape {found} on {other.name}, expected {shape}")
        outputs.append(got)
    return judge(case, answer, change, torch.cat([o.to(answer.device) for o in outputs]), contract)


def _unanswered(change: RaggedRelated, contract: RaggedContract, why: str) -> RaggedViolation:
    """The violation of related cases the backend gave no answer on, though it gave one on the case."""
    return RaggedViolation(change.relation, tuple(c.name for c in change.cases), contract.form, (), 0, 0, 0,
                           math.nan, math.nan, math.nan, f"{change.note}; {why}" if change.note else why)


# --------------------------------------------------------------------------- judging

def judge(case: RaggedCase, answer: torch.Tensor, change: RaggedRelated, related_answer: torch.Tensor,
          contract: RaggedContract) -> RaggedViolation | None:
    """Whether `related_answer` (every related case's rows, end to end) follows from `answer` (on `case`) as
    `change` says: each case row, scaled and (ABSOLUTE) moved `shift` columns right, is the related row it moved
    to, -inf in the related columns it does not reach; judged inside the related windows, and everywhere under
    TAIL_NEG_INF. None when it does; else the violation, its first position row-major over the case's rows."""
    shift = change.shift if contract.form == LogitsForm.ABSOLUTE else 0
    rows, width = answer.shape
    related_width = related_answer.shape[1]
    starts = torch.cat([c.k_start for c in change.cases]).to(answer.device)
    ends = torch.cat([c.k_end for c in change.cases]).to(answer.device)
    step = max(1, CHUNK_ELEMENTS // max(related_width, 1))
    bad: list[int] = []
    first: tuple[int, int, int] | None = None  # (case row, related row, column)
    for lo in range(0, rows, step):
        hi = min(lo + step, rows)
        to = change.rows[lo:hi].to(answer.device)
        want = torch.full((hi - lo, related_width), -math.inf, dtype=torch.float64, device=answer.device)
        want[:, shift:shift + width] = answer[lo:hi].double() * change.scale
        inside = _inside(starts[to], ends[to], related_width, contract.form)
        judged = inside if contract.mask == MaskConvention.TAIL_UNSPECIFIED else torch.ones_like(inside)
        # The tolerance scales with the row's largest finite |logit| over every column judged: a kernel that writes
        # finite values outside its windows is the oracle's to fault; here their rounding is judged as the rest.
        wrong = judged & ~agrees(want, related_answer[to].double(), judged, False, contract.rtol)
        bad += (torch.nonzero(wrong.any(dim=1)).flatten() + lo).tolist()
        if first is None and bool(wrong.any()):
            row, column = (int(i) for i in torch.nonzero(wrong)[0])
            first = (lo + row, int(to[row]), column)
    if first is None:
        return None
    row, related_row, column = first
    original = float(answer[row, column - shift]) if shift <= column < shift + width else -math.inf
    return RaggedViolation(change.relation, tuple(c.name for c in change.cases), contract.form, tuple(bad[:ROWS_KEPT]),
                           row, related_row, column, original, float(related_answer[related_row, column]),
                           original * change.scale, change.note)


def _inside(starts: torch.Tensor, ends: torch.Tensor, width: int, form: LogitsForm) -> torch.Tensor:
    """bool [rows, width]: the columns of each row's window in `form` (keys [start, end), or offsets below the
    window's length)."""
    columns = torch.arange(width, device=starts.device)[None, :]
    if form == LogitsForm.ABSOLUTE:
        return (columns >= starts[:, None]) & (columns < ends[:, None])
    return columns < (ends - starts)[:, None]


# --------------------------------------------------------------------------- the relations

def _derived(case: RaggedCase, relation: RaggedRelation, suffix: str = "", **fields: object) -> RaggedCase:
    """A related case: `fields` replaced, named '<case>~<relation><suffix>', no longer the spec's draw."""
    meta = {key: value for key, value in case.meta.items() if key not in ("spec", "seed")}
    return dataclasses.replace(case, name=f"{case.name}~{relation.value}{suffix}", meta=meta, **fields).validate()


def _unmoved(case: RaggedCase) -> torch.Tensor:
    """Every row where it was."""
    return torch.arange(case.rows, device=case.device)


def _rows(case: RaggedCase, index: torch.Tensor) -> dict[str, torch.Tensor]:
    """q, weights and windows of the rows `index` (in that order)."""
    return dict(q=case.q[index], weights=case.weights[index], k_start=case.k_start[index], k_end=case.k_end[index])


def _shift_keys(case: RaggedCase, generator: torch.Generator) -> RaggedRelated | None:
    shift = next((s for s in SHIFTS if case.keys + s <= MAX_KEYS), None)
    if shift is None:
        return None
    canaries = torch.full((shift, case.head_dim), case.fp8.nan_byte, dtype=torch.uint8, device=case.device)
    nan_scales = torch.full((shift,), math.nan, dtype=torch.float32, device=case.device)
    moved = _derived(case, RaggedRelation.SHIFT_KEYS, k=torch.cat([canaries, case.k]),
                     k_scale=torch.cat([nan_scales, case.k_scale]), k_start=case.k_start + shift,
                     k_end=case.k_end + shift)
    return RaggedRelated(RaggedRelation.SHIFT_KEYS, (moved,), _unmoved(case), shift=shift,
                         note=f"{shift} keys inserted before the buffer")


def _permute_rows(case: RaggedCase, generator: torch.Generator) -> RaggedRelated | None:
    if case.rows < 2:
        return None
    order = shuffle(case.rows, generator).to(case.device)  # row order[i] goes to position i
    moved = _derived(case, RaggedRelation.PERMUTE_ROWS, **_rows(case, order))
    return RaggedRelated(RaggedRelation.PERMUTE_ROWS, (moved,), torch.argsort(order))


def _scale_q(case: RaggedCase, generator: torch.Generator) -> RaggedRelated | None:
    values = case.q_values(torch.float32)
    if bool((values.abs() <= Q_SCALED_MAX).all()):
        try:
            doubled = _derived(case, RaggedRelation.SCALE_Q, q=encode_exact(values * 2, case.fp8, "q"))
            return RaggedRelated(RaggedRelation.SCALE_Q, (doubled,), _unmoved(case), scale=2.0, note="q x 2")
        except SpecError:  # a double that is no e4m3 value of this flavour: the weights instead
            pass
    weights = case.weights * 2
    if not bool(torch.isfinite(weights).all()):
        return None
    return RaggedRelated(RaggedRelation.SCALE_Q, (_derived(case, RaggedRelation.SCALE_Q, weights=weights),),
                         _unmoved(case), scale=2.0,
                         note=f"weights x 2: some |q| > {Q_SCALED_MAX:g}, whose double is no e4m3fnuz value")


def _permute_heads(case: RaggedCase, generator: torch.Generator) -> RaggedRelated | None:
    if case.heads < 2:
        return None
    order = shuffle(case.heads, generator).to(case.device)
    moved = _derived(case, RaggedRelation.PERMUTE_HEADS, q=case.q[:, order].contiguous(),
                     weights=case.weights[:, order].contiguous())
    return RaggedRelated(RaggedRelation.PERMUTE_HEADS, (moved,), _unmoved(case))


def _append_keys(case: RaggedCase, generator: torch.Generator) -> RaggedRelated | None:
    count = min(APPENDED, MAX_KEYS - case.keys)
    if count < 1:
        return None
    keys, scales = finite_keys((count, case.head_dim), generator, case.fp8, "k")
    filled = _derived(case, RaggedRelation.APPEND_KEYS, k=torch.cat([case.k, keys.to(case.device)]),
                      k_scale=torch.cat([case.k_scale, scales.to(case.device)]))
    return RaggedRelated(RaggedRelation.APPEND_KEYS, (filled,), _unmoved(case),
                         note=f"{count} keys appended after the buffer")


def _split_rows(case: RaggedCase, generator: torch.Generator) -> RaggedRelated | None:
    """The two halves at the case's max_seqlen_k, so a window-relative row keeps its width in either."""
    if case.rows < 2:
        return None
    half = case.rows // 2
    parts = (torch.arange(0, half, device=case.device), torch.arange(half, case.rows, device=case.device))
    halves = tuple(_derived(case, RaggedRelation.SPLIT_ROWS, f"-{i + 1}of2", max_seqlen_k=case.seqlen_k,
                            **_rows(case, index)) for i, index in enumerate(parts))
    return RaggedRelated(RaggedRelation.SPLIT_ROWS, halves, _unmoved(case),
                         note=f"rows [0, {half}) and [{half}, {case.rows})")


_TRANSFORMS: dict[RaggedRelation, Callable[[RaggedCase, torch.Generator], RaggedRelated | None]] = {
    RaggedRelation.SHIFT_KEYS: _shift_keys, RaggedRelation.PERMUTE_ROWS: _permute_rows,
    RaggedRelation.SCALE_Q: _scale_q, RaggedRelation.PERMUTE_HEADS: _permute_heads,
    RaggedRelation.APPEND_KEYS: _append_keys, RaggedRelation.SPLIT_ROWS: _split_rows,
}
