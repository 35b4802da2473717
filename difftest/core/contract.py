"""What a backend declares about itself: how it reads a case and the whole envelope it accepts.

The engine adapts the canonical case to the declared encoding, layout and fp8 flavour; the planner
draws cases inside the declared envelope (heads, head dims, block sizes, next_n, the longest
context and pool) and derives its edge cases from the declared tile sizes and work partition.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, ClassVar

import torch

from difftest.core import hardware
from difftest.core.errors import require
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention, OperationKind, PartitionScope
from difftest.core.schema import Filled, Float, Record

# Positions a decode row's top-k keeps: DeepSeek-V3.2's indexer (index_topk = 2048), also the k of
# vLLM's and sglang's decode top-k kernels (their topk=2048 defaults).
DEFAULT_TOPK = 2048

if TYPE_CHECKING:
    from difftest.core.case import Case


@dataclasses.dataclass(frozen=True)
class WorkPartition:
    """How a kernel cuts its work among workers: units of `unit_tokens` key positions, handed out in
    contiguous ranges. Where a range boundary falls next to an empty or one-token request is where
    schedulers have gone wrong, so the planner derives edge cases from these facts."""

    unit_tokens: int  # key positions per unit of work (a split, a chunk)
    scope: PartitionScope
    workers: int | None = None  # workers sharing the units; None: the GPU's SM count
    halved_at_next_n: tuple[int, ...] = ()  # next_n values at which each worker takes two query atoms

    def worker_count(self, next_n: int, sms: int) -> int:
        """How many workers share the units at `next_n` on a GPU with `sms` SMs."""
        workers = self.workers if self.workers is not None else sms
        return max(1, workers // 2) if next_n in self.halved_at_next_n else workers


@dataclasses.dataclass(frozen=True)
class Siblings(Record):
    """Backends that compute the same logits by another path (DeepGEMM native, flattened and varlen;
    AITER stage1 and fused): `difftest run --time` puts the members of one group side by side on
    each case and flags a member slower than its fastest sibling by more than its `slowdown`.
    A correctness run never sees a path that is 4x slower than it should be (vLLM's varlen path,
    214 us before its fix, 52 us after); this does."""

    what = "a JSON object {group, slowdown}"
    group: Filled("a non-empty group name")  # the name the members share
    slowdown: Float(1, math.inf)  # the most this member may take, as a multiple of its fastest sibling's time on a case

    def __post_init__(self) -> None:
        require(bool(self.group), "siblings.group", self.group, "a non-empty group name")
        require(isinstance(self.slowdown, (int, float)) and 1.0 <= self.slowdown < math.inf, "siblings.slowdown",
                self.slowdown, "a finite factor >= 1")


@dataclasses.dataclass(frozen=True)
class WorkingMemory:
    """Memory a backend's call allocates for itself besides the logits it returns, as data: the
    planner counts it in a case's footprint (generators.envelope.estimate_bytes) and leaves out what
    does not fit, and the runner in the memory of calls run side by side. Linear in the case's logits
    (rows * max_model_len): `bytes_per_logit` bytes each, plus `bytes_per_logit_per_head` bytes per
    query head each (AITER's stage1 callers hold [H, rows, max_model_len] fp32 scores: 4 per head)."""

    bytes_per_logit: int = 0
    bytes_per_logit_per_head: int = 0

    def __post_init__(self) -> None:
        for field in ("bytes_per_logit", "bytes_per_logit_per_head"):
            value = getattr(self, field)
            require(type(value) is int and value >= 0, f"working_memory.{field}", value, "an integer >= 0")

    def bytes_for(self, logits: int, heads: int) -> int:
        """The bytes a call on a case of `logits` logits (rows * max_model_len) and `heads` heads allocates."""
        return logits * (self.bytes_per_logit + heads * self.bytes_per_logit_per_head)


@dataclasses.dataclass(frozen=True)
class Contract:
    """A backend's declared interface and envelope. `None` in an envelope field means any value."""

    operation: ClassVar[OperationKind] = OperationKind.PAGED_LOGITS  # the operation a backend of this contract is
    length_encoding: LengthEncoding
    cache_layout: CacheLayout
    mask: MaskConvention
    fp8: Fp8Flavour = Fp8Flavour.E4M3FN
    output_dtype: torch.dtype = torch.float32
    rtol: float = 1e-3  # allowed error, relative to the row's largest |expected| in the window
    devices: tuple[str, ...] = ("cpu", "cuda")
    archs: tuple[str, ...] | None = None  # e.g. ("sm90",): GPU archs accepted
    next_n: tuple[int, ...] | None = None
    block_sizes: tuple[int, ...] | None = None  # a case of another block size is re-paged when 1 is listed
    head_dims: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    heads_multiple_of: int = 1
    heads_power_of_two: bool = False  # e.g. all heads as one tl.arange block
    max_context: int | None = None  # the longest max_model_len it takes
    max_pool_bytes: int | None = None  # the largest cache (num_blocks * block_size * (D + 4) bytes) it takes
    max_batch: int | None = None  # the most requests it is handed in one call (a flattened encoding's rows)
    tiles: tuple[int, ...] = ()  # key-position tile sizes it is known to use: their multiples +-1 are edges
    partition: WorkPartition | None = None  # how it spreads work over workers, when known
    writes_into_output: bool = False  # the backend fills a buffer the engine allocates (poisoned)
    working_memory: WorkingMemory = WorkingMemory()  # what its call allocates besides the logits it returns
    library: str = ""  # distribution name and version actually loaded (and where from), for the report
    siblings: Siblings | None = None  # the paths computing the same logits it is timed against (--time)
    # Whether `difftest fuzz` may concatenate small cases of one shape into one launch (pools stacked,
    # rows split back per case). A failing case is tried again (with the other failures, then alone)
    # before it counts, so a kernel whose answer depends on the batch costs time, not a wrong verdict.
    batchable: bool = False
    # The k of the top-k that consumes the logits: the comparison's top-k overlap is taken at this k, over
    # the rows whose window is longer (difftest.engine.comparison.topk_overlap).
    topk: int = DEFAULT_TOPK

    def __post_init__(self) -> None:
        require(type(self.topk) is int and self.topk >= 1, "topk", self.topk, "an integer >= 1")

    def block_size_for(self, block_size: int) -> int | None:
        """The block size a case of `block_size` is handed at (itself, or 1 when it can be re-paged
        to tokens); None when the contract takes neither."""
        if self.block_sizes is None or block_size in self.block_sizes:
            return block_size
        return 1 if 1 in self.block_sizes else None

    def accepts(self, case: Case, device: str) -> str | None:
        """Why this contract does not take `case` on `device`, or None when it does."""
        if device not in self.devices:
            return f"contract devices {list(self.devices)} exclude {device}"
        if self.archs is not None and device == "cuda" and hardware.arch() not in self.archs:
            return f"contract archs {list(self.archs)} exclude {hardware.arch()}"
        return self.shape_reason(case.next_n, case.heads, case.head_dim, case.block_size) or self._size_reason(case)

    def shape_reason(self, next_n: int, heads: int, head_dim: int, block_size: int) -> str | None:
        """Why this contract does not take a case of these dimensions, or None when it does."""
        checks = [("next_n", next_n, self.next_n), ("head_dim", head_dim, self.head_dims), ("heads", heads, self.heads)]
        for field, value, allowed in checks:
            if allowed is not None and value not in allowed:
                return f"contract {field} {list(allowed)} excludes {value}"
        if heads % self.heads_multiple_of:
            return f"heads={heads} is not a multiple of {self.heads_multiple_of}"
        if self.heads_power_of_two and heads & (heads - 1):
            return f"heads={heads} is not a power of two"
        if self.block_size_for(block_size) is None:
            return f"contract block_sizes {list(self.block_sizes or ())} exclude {block_size} (and 1 is not listed)"
        return None

    def _size_reason(self, case: Case) -> str | None:
        return self.limits_reason(case.max_model_len, case.pool_bytes, case.batch, case.next_n)

    def limits_reason(self, max_model_len: int, pool_bytes: int, batch: int, next_n: int) -> str | None:
        """Why a case of this size passes a declared limit (max_context, max_pool_bytes, max_batch), or None.
        A flattened encoding hands the kernel one request per row: batch * next_n of them."""
        if self.max_context is not None and max_model_len > self.max_context:
            return f"max_model_len={max_model_len} exceeds the contract's max_context {self.max_context}"
        if self.max_pool_bytes is not None and pool_bytes > self.max_pool_bytes:
            return f"a {pool_bytes}-byte cache exceeds the contract's max_pool_bytes {self.max_pool_bytes}"
        flattened = self.length_encoding in (LengthEncoding.FLATTENED, LengthEncoding.FLATTENED_INDICES)
        handed = batch * next_n if flattened else batch
        if self.max_batch is not None and handed > self.max_batch:
            return f"{handed} requests in one call exceed the contract's max_batch {self.max_batch}"
        return None
