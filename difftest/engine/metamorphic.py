"""Metamorphic relations: checks of a backend that need no oracle, so they run where none fits (a 1M-token
row, a format the oracle does not implement).

A relation (difftest.core.kinds.MetamorphicRelation) turns a case into related cases whose logits follow from
the case's:

* permute-pages: the physical blocks renumbered by a permutation, the table remapped: the same logits;
* reorder-requests: the requests shuffled: each row's logits move with its request;
* pad-requests: an empty request (L = 0; its q and weights the next request's, negated; its table row a copy of
  the next request's, as a recycled table holds) before every request and after the last: the rows are
  unchanged and every padding row has an empty window;
* split-batch: the first half of the requests and the second in two launches: the rows laid end to end;
* flatten-next-n: every draft row a request of next_n 1 with its own limit (the flattened encoding,
  difftest.core.kernel_inputs.encode_lengths), the kernel's next_n-1 path: the same logits;
* scale-q: q times 2, where every |q| <= 120 (its double is then an e4m3 value of both flavours, e4m3fnuz
  stopping at 240); else the weights times 2 (fp32: exact). Every logit doubles, exactly: a power of two
  commutes with every rounding of the sums, as long as nothing overflows;
* permute-heads: the heads shuffled with their weights: the same head sum (in another order);
* append-keys: every pool slot no window covers (past each sequence's length, the canary and stale blocks)
  given finite keys and positive scales: no window changes, so no logit does.

Each related case is derived from the case alone (its random choices from a fixed seed per relation), so the
case's own spec and seed and the relation's name draw the pair again. Where the kernel is deterministic and
the relation exact (permute-pages, scale-q and append-keys: a launch of the same shape, the same sums in the
same order), the related logits must equal the expected ones bit for bit, inside every window and, under
tail-neg-inf, past it; else (the relations that change the batch, which may change the schedule, and
flatten-next-n and permute-heads, whose sums run in another order) within the contract's rtol of each row's
largest |logit| in its window; a -inf where a finite value belongs, or the reverse, is wrong either way. A
kernel is taken as deterministic until an exact relation fails: then the case is launched again, and if its two
outputs differ the relation is judged within rtol instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from difftest.backends import Loaded
from difftest.core.case import Case
from difftest.core.contract import Contract
from difftest.core.errors import SpecError
from difftest.core.fp8 import convert, decode, encode_exact
from difftest.core.kernel_inputs import encode_lengths
from difftest.core.kinds import Fp8Flavour, LengthEncoding, MaskConvention, MetamorphicRelation
from difftest.core.verdict import Verdict
from difftest.engine.call import launch
from difftest.engine.config import RunConfig
from difftest.engine.guards import Execution
from difftest.engine.isolate import Executor
from difftest.engine.result import CaseResult, Violation

SEED = 20261204  # each relation's random choices: SEED + its place in MetamorphicRelation
Q_SCALED_MAX = 120.0  # |q| whose double is an e4m3 value of both flavours (e4m3fnuz's largest is 240)
CHUNK_ELEMENTS = 1 << 25  # logits judged at once: a few float64 copies of this many stay under 2 GB
ROWS_KEPT = 1024  # rows a violation lists at most


@dataclasses.dataclass(frozen=True)
class Related:
    """A case changed by a relation: the related cases, and how their logits follow from the case's."""

    relation: MetamorphicRelation
    cases: tuple[Case, ...]  # run in turn; their outputs laid end to end (by rows)
    rows: torch.Tensor  # (case rows,) int64: the row of those outputs each row of the case moved to
    scale: float = 1.0  # related logit = scale * the case's logit
    exact: bool = True  # bit for bit for a deterministic kernel (else within rtol)
    note: str = ""  # how it was made, and why so


def related(case: Case, relation: MetamorphicRelation) -> Related | None:
    """`case` changed by `relation`; None where the relation changes nothing here (one request to reorder or
    split, next_n 1 to flatten, one head to permute, no slot outside every window)."""
    generator = torch.Generator().manual_seed(SEED + list(MetamorphicRelation).index(relation))
    return _TRANSFORMS[relation](case, generator)


def check(backend: Loaded, case: Case, relations: Sequence[MetamorphicRelation], config: RunConfig,
          executor: Executor) -> tuple[Violation, ...]:
    """The relations that do not hold for `backend` on `case`, each related case launched where the backend
    runs (`executor`), once each; () when the case itself gives no output now."""
    once = dataclasses.replace(config, repeat=1, time=None)
    first = launch(backend, case, once, executor)
    if not isinstance(first, Execution):
        return ()
    violations = []
    for relation in relations:
        change = related(case, relation)
        if change is not None:
            violation = _checked(backend, case, change, first.outputs[0], once, executor)
            violations += [violation] if violation is not None else []
    return tuple(violations)


def _checked(backend: Loaded, case: Case, change: Related, original: torch.Tensor, config: RunConfig,
             executor: Executor) -> Violation | None:
    """Whether `change` holds for the backend, whose logits on `case` are `original`."""
    outputs = []
    for other in change.cases:
        done = launch(backend, other, config, executor)
        if isinstance(done, CaseResult) and done.verdict == Verdict.SKIP:
            return None  # the backend does not take the related case (its envelope): nothing to relate
        if not isinstance(done, Execution):
            return _failed_on(change, done)
        outputs.append(done.outputs[0])
    got = torch.cat(outputs)
    violation = judge(original, got, change, case.row_lens().reshape(-1), backend.contract)
    if violation is None or not change.exact:
        return violation
    again = launch(backend, case, config, executor)  # deterministic? if not, a bit-for-bit relation cannot hold
    if isinstance(again, Execution) and not _same_bits(again.outputs[0], original):
        return judge(original, got, dataclasses.replace(change, exact=False), case.row_lens().reshape(-1),
                     backend.contract)
    return violation


def _failed_on(change: Related, result: CaseResult) -> Violation:
    """The backend gave no output on a related case, though it gave one on the case."""
    why = f"{result.verdict.value} on the related case: {result.reason or 'no output'}"
    return Violation(change.relation, tuple(c.name for c in change.cases), (), 0, 0, math.nan, math.nan, math.nan,
                     change.exact, f"{change.note}; {why}" if change.note else why)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two outputs hold the same bits (NaN payloads and -0.0 included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# --------------------------------------------------------------------------- judging

def judge(original: torch.Tensor, got: torch.Tensor, change: Related, row_lens: torch.Tensor,
          contract: Contract) -> Violation | None:
    """Whether the related logits `got` (every related case's rows, laid end to end) follow from `original`
    (the case's) as `change` says: inside each row's window, past it under tail-neg-inf (-inf follows from
    -inf), and on rows of `got` no case row moved to (padding requests: no window) -inf everywhere under
    tail-neg-inf. None when they do; else the Violation, its first position row-major."""
    tail = contract.mask == MaskConvention.TAIL_NEG_INF
    rows, width = original.shape
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    bad: list[int] = []
    first: tuple[int, int, float, float, float] | None = None
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        want = original[start:stop].double() * change.scale
        have = got[change.rows[start:stop].to(got.device)].double()
        inside = torch.arange(width, device=want.device)[None, :] < row_lens[start:stop, None].to(want.device)
        judged = torch.ones_like(inside) if tail else inside
        wrong = judged & ~agrees(want, have, inside, change.exact, contract.rtol)
        bad += (torch.nonzero(wrong.any(dim=1)).flatten() + start).tolist()
        if first is None and bool(wrong.any()):
            row, position = (int(i) for i in torch.nonzero(wrong)[0])
            first = (start + row, position, float(original[start + row, position]),
                     float(have[row, position]), float(want[row, position]))
    padding = _padding_wrong(got, change.rows) if tail else []
    if not bad and not padding:
        return None
    if first is None:  # only padding rows: the case's own rows all hold
        row = padding[0]
        position = int(torch.nonzero(got[row].double() != -math.inf)[0])
        first = (row, position, -math.inf, float(got[row, position]), -math.inf)
    kept = tuple((bad + padding)[:ROWS_KEPT])
    return Violation(change.relation, tuple(c.name for c in change.cases), kept, first[0], first[1], first[2],
                     first[3], first[4], change.exact, change.note)


def agrees(want: torch.Tensor, have: torch.Tensor, inside: torch.Tensor, exact: bool, rtol: float) -> torch.Tensor:
    """Where `have` follows from `want`: equal (NaN with NaN: the same garbage), or within rtol of the row's
    largest finite |want| in its window (`inside`) when not exact. The ragged relations judge by it too."""
    same = (want == have) | (torch.isnan(want) & torch.isnan(have))
    if exact:
        return same
    finite = torch.isfinite(want) & inside
    scale = torch.where(finite, want.abs(), torch.zeros_like(want)).amax(dim=1, keepdim=True)
    return same | ((want - have).abs() <= rtol * scale)


def _padding_wrong(got: torch.Tensor, rows: torch.Tensor) -> list[int]:
    """Rows of `got` no case row moved to (padding requests' rows) that are not -inf everywhere."""
    extra = torch.ones(got.shape[0], dtype=torch.bool, device=got.device)
    extra[rows.to(got.device)] = False
    if not bool(extra.any()):
        return []
    not_inf = (got[extra].double() != -math.inf).any(dim=1)
    return torch.nonzero(extra).flatten()[not_inf].tolist()


# --------------------------------------------------------------------------- the relations

def _derived(case: Case, relation: MetamorphicRelation, suffix: str = "", **fields: object) -> Case:
    """A related case: `fields` replaced, named '<case>~<relation><suffix>', and no longer the spec's draw."""
    meta = {k: v for k, v in case.meta.items() if k not in ("spec", "seed")}
    return dataclasses.replace(case, name=f"{case.name}~{relation.value}{suffix}", meta=meta, **fields)


def _requests(case: Case, index: torch.Tensor) -> dict[str, torch.Tensor]:
    """q, weights, table and lengths of the requests `index` (in that order)."""
    rows = (index[:, None] * case.next_n + torch.arange(case.next_n, device=case.device)).flatten()
    return dict(q=case.q[index], weights=case.weights[rows], block_table=case.block_table[index],
                seq_lens=case.seq_lens[index])


def _unmoved(case: Case) -> torch.Tensor:
    """Every row where it was: the related outputs' rows in the case's order."""
    return torch.arange(case.rows, device=case.device)


def _row_of(request: torch.Tensor, next_n: int) -> torch.Tensor:
    """(requests * next_n,) the related row of each row, request b having moved to position request[b]."""
    return (request[:, None] * next_n + torch.arange(next_n, device=request.device)).flatten()


def shuffle(size: int, generator: torch.Generator) -> torch.Tensor:
    """A random permutation of range(size) that moves something (a rotation when the draw moves nothing)."""
    order = torch.randperm(size, generator=generator)
    if bool((order == torch.arange(size)).all()):
        order = torch.roll(order, 1)
    return order


def _permute_pages(case: Case, generator: torch.Generator) -> Related:
    blocks = case.k_pool.shape[0]
    new_id = shuffle(blocks, generator).to(case.device)  # old block b becomes block new_id[b]
    old_at = torch.argsort(new_id)  # the old block now at each id
    table = case.block_table.to(torch.int64)
    inside = (table >= 0) & (table < blocks)
    remapped = torch.where(inside, new_id[table.clamp(0, blocks - 1)], table).to(case.block_table.dtype)
    moved = _derived(case, MetamorphicRelation.PERMUTE_PAGES, k_pool=case.k_pool[old_at],
                     scale_pool=case.scale_pool[old_at], block_table=remapped)
    return Related(MetamorphicRelation.PERMUTE_PAGES, (moved,), _unmoved(case))


# Why the relations that change the batch are judged within rtol: a launch of another batch may take another
# schedule (DeepGEMM's work partition, a BLAS blocking picked by shape), and a correct kernel may round per shape.
_ANOTHER_SHAPE = "another batch: judged within rtol"


def _reorder_requests(case: Case, generator: torch.Generator) -> Related | None:
    if case.batch < 2:
        return None
    order = shuffle(case.batch, generator).to(case.device)  # request order[i] goes to position i
    moved = _derived(case, MetamorphicRelation.REORDER_REQUESTS, **_requests(case, order))
    return Related(MetamorphicRelation.REORDER_REQUESTS, (moved,), _row_of(torch.argsort(order), case.next_n),
                   exact=False, note=_ANOTHER_SHAPE)


def _pad_requests(case: Case, generator: torch.Generator) -> Related:
    """An empty request before each request and after the last: its q and weights the next request's negated
    (another q than its neighbour's: a kernel that scores the next request with it is wrong), its table row a
    copy of the next request's."""
    batch, next_n = case.batch, case.next_n
    source = torch.arange(batch, device=case.device)
    source = torch.stack([source, source], dim=1).flatten()  # pad b, request b, ...
    source = torch.cat([source, source[-1:]])  # and a pad after the last
    parts = _requests(case, source)
    pads = torch.ones(2 * batch + 1, dtype=torch.bool, device=case.device)
    pads[1::2] = False
    negated = encode_exact(-decode(parts["q"], case.fp8, torch.float32), case.fp8, "q")
    parts["q"] = torch.where(pads[:, None, None, None], negated, parts["q"])
    pad_rows = pads.repeat_interleave(next_n)
    parts["weights"] = torch.where(pad_rows[:, None], -parts["weights"], parts["weights"])
    parts["seq_lens"] = torch.where(pads, torch.zeros_like(parts["seq_lens"]), parts["seq_lens"])
    padded = _derived(case, MetamorphicRelation.PAD_REQUESTS, **parts)
    position = 2 * torch.arange(batch, device=case.device) + 1
    return Related(MetamorphicRelation.PAD_REQUESTS, (padded,), _row_of(position, next_n), exact=False,
                   note=f"{batch + 1} empty requests between and after the {batch}; {_ANOTHER_SHAPE}")


def _split_batch(case: Case, generator: torch.Generator) -> Related | None:
    if case.batch < 2:
        return None
    half = case.batch // 2
    parts = [torch.arange(0, half, device=case.device), torch.arange(half, case.batch, device=case.device)]
    halves = tuple(_derived(case, MetamorphicRelation.SPLIT_BATCH, f"-{i + 1}of2", **_requests(case, index))
                   for i, index in enumerate(parts))
    return Related(MetamorphicRelation.SPLIT_BATCH, halves, _unmoved(case), exact=False,
                   note=f"requests [0, {half}) and [{half}, {case.batch}); {_ANOTHER_SHAPE}")


def _flatten_next_n(case: Case, generator: torch.Generator) -> Related | None:
    """The flattened encoding made a case: one request of next_n 1 per draft row, whose length is the row's
    limit (so at next_n 1 its one row sees exactly that), its q row and the table row of its sequence."""
    if case.next_n < 2:
        return None
    parts = encode_lengths(case, LengthEncoding.FLATTENED)
    flat = _derived(case, MetamorphicRelation.FLATTEN_NEXT_N, q=parts["q"], block_table=parts["block_table"],
                    seq_lens=parts["context_lens"].to(torch.int64))
    return Related(MetamorphicRelation.FLATTEN_NEXT_N, (flat,), _unmoved(case), exact=False,
                   note="the kernel's next_n-1 path: its sums may run in another order")


def _scale_q(case: Case, generator: torch.Generator) -> Related:
    values = decode(case.q, case.fp8, torch.float32)
    if bool((values.abs() <= Q_SCALED_MAX).all()):
        try:
            doubled = _derived(case, MetamorphicRelation.SCALE_Q, q=encode_exact(values * 2, case.fp8, "q"))
            return Related(MetamorphicRelation.SCALE_Q, (doubled,), _unmoved(case), scale=2.0,
                           note="q x 2")
        except SpecError:  # a double that is no e4m3 value of this flavour: the weights instead
            pass
    doubled = _derived(case, MetamorphicRelation.SCALE_Q, weights=case.weights * 2)
    return Related(MetamorphicRelation.SCALE_Q, (doubled,), _unmoved(case), scale=2.0,
                   note=f"weights x 2: some |q| > {Q_SCALED_MAX:g}, whose double is no e4m3fnuz value")


def _permute_heads(case: Case, generator: torch.Generator) -> Related | None:
    if case.heads < 2:
        return None
    order = shuffle(case.heads, generator).to(case.device)
    moved = _derived(case, MetamorphicRelation.PERMUTE_HEADS, q=case.q[:, :, order].contiguous(),
                     weights=case.weights[:, order].contiguous())
    return Related(MetamorphicRelation.PERMUTE_HEADS, (moved,), _unmoved(case), exact=False,
                   note="the head sum in another order")


def _append_keys(case: Case, generator: torch.Generator) -> Related | None:
    """Finite keys (N(0, 1) clamped to +-8) and scales in [0.5, 2) in every slot no window covers."""
    covered = _covered_slots(case)
    if bool(covered.all()):
        return None
    keys, scales = finite_keys(tuple(case.k_pool.shape), generator, case.fp8, "k_pool")
    filled = _derived(case, MetamorphicRelation.APPEND_KEYS,
                      k_pool=torch.where(covered[..., None], case.k_pool, keys.to(case.device)),
                      scale_pool=torch.where(covered, case.scale_pool, scales.to(case.device)))
    return Related(MetamorphicRelation.APPEND_KEYS, (filled,), _unmoved(case),
                   note=f"{int((~covered).sum())} slots outside every window filled")


def finite_keys(shape: tuple[int, ...], generator: torch.Generator, flavour: Fp8Flavour,
                field: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 fp8 keys of `shape` in `flavour`, float32 scales of shape[:-1]): N(0, 1) clamped to +-8 and scales in
    [0.5, 2). Drawn as e4m3fn and converted, as the generators draw: values of both flavours, so any backend takes
    them. The keys append-keys puts where no window reaches (here and in difftest.engine.ragged_metamorphic)."""
    drawn = torch.randn(shape, generator=generator).clamp(-8, 8).to(torch.float8_e4m3fn).view(torch.uint8)
    return convert(drawn, Fp8Flavour.E4M3FN, flavour, field), 0.5 + 1.5 * torch.rand(shape[:-1], generator=generator)


def _covered_slots(case: Case) -> torch.Tensor:
    """(num_blocks, block_size) bool: the slots some sequence's window covers."""
    blocks, block_size = case.k_pool.shape[:2]
    positions = torch.arange(case.block_table.shape[1] * block_size, device=case.device)
    visible = positions[None, :] < case.seq_lens[:, None]  # (B, W * block_size)
    ids = case.block_table.to(torch.int64).repeat_interleave(block_size, dim=1)[visible]
    covered = torch.zeros(blocks * block_size, dtype=torch.bool, device=case.device)
    covered[ids * block_size + (positions % block_size).expand_as(visible)[visible]] = True
    return covered.reshape(blocks, block_size)


_TRANSFORMS: dict[MetamorphicRelation, Callable[[Case, torch.Generator], Related | None]] = {
    MetamorphicRelation.PERMUTE_PAGES: _permute_pages, MetamorphicRelation.REORDER_REQUESTS: _reorder_requests,
    MetamorphicRelation.PAD_REQUESTS: _pad_requests, MetamorphicRelation.SPLIT_BATCH: _split_batch,
    MetamorphicRelation.FLATTEN_NEXT_N: _flatten_next_n, MetamorphicRelation.SCALE_Q: _scale_q,
    MetamorphicRelation.PERMUTE_HEADS: _permute_heads, MetamorphicRelation.APPEND_KEYS: _append_keys,
}
