"""Small cases of one shape concatenated into one launch, and the launch's rows split back per case.

`difftest fuzz` spends most of a small case's time on per-call overheads (a round trip to each
worker, an oracle launch, a comparison), not on the kernel. A Batch stacks its members' pools (block
ids offset by the blocks before them), pads their block tables to the widest (with each member's
own last column, so a padded entry points where that member's stale entries point), concatenates
q, weights and lengths, and takes the largest max_model_len. One oracle call and one call per
backend then serve every member; `member_reference` and `member_execution` cut out a member's rows
and its own max_model_len columns, which is exactly what the member alone gives: every row's
logits depend only on its own sequence (the oracle's rows and bounds are row-local).

A kernel's own answer may depend on the batch (its schedule, split sizes, max_model_len): the runner
tries a member that fails in a batch again, with the batch's other failures and then alone, and only
the retry's result counts (difftest.engine.batch_policy).
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from difftest.core.case import Case
from difftest.engine.guards import Execution
from difftest.engine.result import CaseResult
from difftest.generators.spec import CaseSpec
from difftest.oracles.reference import Reference

BatchKey = tuple[int, int, int, int, str]  # (next_n, heads, head_dim, block_size, fp8 flavour)


def batch_key(spec: CaseSpec) -> BatchKey:
    """What cases must share to go into one launch."""
    return spec.next_n, spec.heads, spec.head_dim, spec.block_size, spec.fp8.value


@dataclasses.dataclass(frozen=True)
class Retry:
    """One launch of a batch's failed members, tried again: `members` of them together (1: alone), of
    which `failed` failed there too."""

    backend: str
    members: int
    failed: int


@dataclasses.dataclass(frozen=True)
class Batch:
    """Members merged into `case`; `first_rows[i]` is member i's first row in it.

    As the runner finds them: `diverged`, the results of members that failed in the batch but passed
    alone (a kernel whose answer depends on what else is in the launch), `whole`, per backend with
    such a member, its result on the merged case itself (a valid case it gets wrong), and `retries`,
    the launches that tried failed members again."""

    members: tuple[Case, ...]
    case: Case
    first_rows: tuple[int, ...]
    diverged: list[CaseResult] = dataclasses.field(default_factory=list)
    whole: dict[str, CaseResult] = dataclasses.field(default_factory=dict)
    retries: list[Retry] = dataclasses.field(default_factory=list)

    @property
    def spans(self) -> list[tuple[int, int]]:
        """(first row, rows) of each member in the merged case."""
        return [(first, m.rows) for first, m in zip(self.first_rows, self.members, strict=True)]

    def reference_of(self, ref: Reference, index: int) -> Reference:
        """Member `index`'s share of the merged case's oracle answer."""
        rows, columns = self._cut(index)
        return dataclasses.replace(ref, logits=ref.logits[rows, :columns], row_lens=ref.row_lens[rows],
                                   bound=ref.bound[rows])

    def execution_of(self, execution: Execution, index: int) -> Execution:
        """Member `index`'s share of each launch's output. An output not shaped [rows, max_model_len]
        goes whole: the comparison then refuses it (ERROR), and the member is run again alone."""
        rows, columns = self._cut(index)
        merged = (self.case.rows, self.case.max_model_len)
        outputs = tuple(out[rows, :columns] if tuple(out.shape) == merged else out for out in execution.outputs)
        return dataclasses.replace(execution, outputs=outputs)

    def validate(self) -> Batch:
        """Check the merged case and every member, as each member's own validate() would, in one pass
        over the merged tensors; SpecError names the first impossible field of the first bad member.

        What the merged case's checks cannot see of a member (a length within the batch's max_model_len
        but past its own; a block id inside the merged pool but outside its own blocks; the width of its
        own table) is checked against each request's own bounds at once; only when something fails are
        the members validated one by one, for the error each would raise."""
        for member in self.members:
            member.validate_layout()
        self.case.validate()
        if not bool(self._members_within_bounds()):
            for member in self.members:
                member.validate()
        return self

    def _members_within_bounds(self) -> torch.Tensor:
        """Whether every request stays inside its own member's max_model_len, table width and blocks."""
        case, device = self.case, self.case.device
        per_request = [(m.max_model_len, m.block_table.shape[1], offset, m.k_pool.shape[0])
                       for m, offset in zip(self.members, _pool_offsets(self.members), strict=True)
                       for _ in range(m.batch)]
        bounds = torch.tensor(per_request, dtype=torch.int64, device=device).reshape(-1, 4)  # (B, 4), B may be 0
        max_len, columns, first, blocks = bounds.unbind(1)
        lens = case.seq_lens.to(torch.int64)
        table = case.block_table.to(torch.int64)
        used = torch.arange(table.shape[1], device=device)[None, :] < case.used_blocks()[:, None]
        own = (table >= first[:, None]) & (table < (first + blocks)[:, None])
        return (lens <= max_len).all() & (lens <= columns * case.block_size).all() & (own | ~used).all()

    def _cut(self, index: int) -> tuple[slice, int]:
        member = self.members[index]
        first = self.first_rows[index]
        return slice(first, first + member.rows), member.max_model_len


def merge(members: list[Case]) -> Batch:
    """One case holding every member's requests, in order; members must share batch_key's fields."""
    first = members[0]
    offsets = _pool_offsets(members)
    width = max(m.block_table.shape[1] for m in members)
    tables = [_widened(m.block_table + offset, width) for m, offset in zip(members, offsets, strict=True)]
    case = Case(name=f"batch-{first.name}+{len(members) - 1}", q=torch.cat([m.q for m in members]),
                k_pool=torch.cat([m.k_pool for m in members]), scale_pool=torch.cat([m.scale_pool for m in members]),
                weights=torch.cat([m.weights for m in members]), block_table=torch.cat(tables),
                seq_lens=torch.cat([m.seq_lens for m in members]),
                max_model_len=max(m.max_model_len for m in members), fp8=first.fp8,
                meta={"families": sorted({f for m in members for f in m.meta.get("families", ())})})
    if all(m.known_lengths is not None for m in members):  # then the merged case's too, without a host wait
        case.knowing_lengths([length for m in members for length in m.lengths])
    first_rows = tuple(itertools.accumulate((m.rows for m in members[:-1]), initial=0))
    return Batch(tuple(members), case, first_rows)


def joined(shares: list[Reference], width: int) -> Reference:
    """The oracle's answer for cases merged in this order, from each case's own answer: their rows laid
    end to end, each padded with -inf to `width` (the merged max_model_len; past a case's own width
    nothing is inside its windows, and -inf is what the oracle writes outside them)."""
    first = shares[0]
    return dataclasses.replace(first, logits=torch.cat([padded(share.logits, width) for share in shares]),
                               row_lens=torch.cat([share.row_lens for share in shares]),
                               bound=torch.cat([share.bound for share in shares]))


def padded(logits: torch.Tensor, width: int) -> torch.Tensor:
    """`logits` [rows, w <= width] widened to `width` columns of -inf."""
    return torch.nn.functional.pad(logits, (0, width - logits.shape[1]), value=float("-inf"))


def _pool_offsets(members: tuple[Case, ...] | list[Case]) -> list[int]:
    """The merged pool's first block of each member's pool."""
    return list(itertools.accumulate((m.k_pool.shape[0] for m in members[:-1]), initial=0))


def _widened(table: torch.Tensor, width: int) -> torch.Tensor:
    """`table` (int32 [B, W]) padded to `width` columns with copies of its last column."""
    extra = width - table.shape[1]
    return torch.cat([table, table[:, -1:].expand(-1, extra)], dim=1) if extra else table
