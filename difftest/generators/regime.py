"""Regime: bounds that aim a campaign at one part of the envelope (small batches, short contexts, one
shape), so its rate and its findings are those of that part alone. Errors name these fields. No
torch: it judges specs, not tensors.
"""

from __future__ import annotations

import dataclasses

from difftest.core.errors import require
from difftest.core.spec import CaseSpec


@dataclasses.dataclass(frozen=True)
class Regime:
    """Bounds on the cases a campaign draws; None leaves a dimension free."""

    max_batch: int | None = None  # requests per case, padding requests included
    max_context: int | None = None  # max_model_len
    heads: int | None = None
    head_dim: int | None = None
    block_size: int | None = None

    def __post_init__(self) -> None:
        for field in ("max_batch", "max_context", "heads", "block_size"):
            value = getattr(self, field)
            require(value is None or (type(value) is int and value >= 1), field, value, "None or an integer >= 1")
        require(self.head_dim is None or (type(self.head_dim) is int and self.head_dim >= 16
                                          and self.head_dim % 16 == 0), "head_dim", self.head_dim,
                "None or a positive multiple of 16")

    def apply(self, spec: CaseSpec) -> CaseSpec | None:
        """`spec` inside the regime, or None when it cannot be.

        A spec of another heads, head_dim or block_size is left out. A drawn spec (no fixed lengths,
        no sized pool) has its batch, padding and max_model_len lowered to the bounds: its lengths are
        drawn afresh within them. A spec with fixed lengths keeps them, so it is left out unless they
        fit (its max_model_len is lowered to max_context when every length fits under it). One with a
        sized pool (2^31-byte caches, block ids past 2^16) is about size, so a regime that bounds
        batch or context leaves it out."""
        pinned = ((self.heads, spec.heads), (self.head_dim, spec.head_dim), (self.block_size, spec.block_size))
        if any(bound is not None and bound != value for bound, value in pinned):
            return None
        if spec.pool_blocks is not None:
            return spec if self.max_batch is None and self.max_context is None else None
        context = min(spec.max_model_len, self.max_context or spec.max_model_len)
        if spec.lengths is not None:
            fixed = spec.replace(max_model_len=max(context, *spec.lengths))
            return fixed if self._fits(fixed) else None
        most = self.max_batch or spec.total_batch
        padding = min(spec.padding, most - 1)  # at least one real request
        return spec.replace(batch=min(spec.batch, most - padding), padding=padding, max_model_len=context)

    def _fits(self, spec: CaseSpec) -> bool:
        return (self.max_batch is None or spec.total_batch <= self.max_batch) and \
            (self.max_context is None or spec.max_model_len <= self.max_context)
