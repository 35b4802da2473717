"""The indexer pipeline as one operation: a paged decode case whose logits a top-k stage turns into the token
set the sparse attention reads (IndexerCase), and what a composed backend declares (IndexerContract: its
logits stage's Contract and its top-k stage's TopkContract, side by side).

The top-k stage of a decode step ranks each logits row inside [0, row_len), row_len being the decode rule
L - next_n + j + 1 of draft row j: the windows a paged case's row limits already are (Case.row_lens), so the
indexer case is the paged case and k. The prefill step's (PrefillIndexerCase) ranks each ragged logits row
inside its key window [k_start, k_end), in the frame of the logits stage's output form.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from difftest.core.case import Case
from difftest.core.contract import Contract
from difftest.core.errors import require
from difftest.core.kinds import LogitsForm, OperationKind
from difftest.core.ragged import TOPK_K_MEMBER, RaggedCase, RaggedContract, load_member
from difftest.core.topk import MAX_WIDTH, TopkCase, TopkContract

K_META = "topk_k"  # the meta key a saved indexer case keeps its k under
# Each indexer operation's logits stage: the operation whose backends make its first half (its second is top-k's).
LOGITS_STAGE = {OperationKind.INDEXER: OperationKind.PAGED_LOGITS,
                OperationKind.PREFILL_INDEXER: OperationKind.RAGGED_LOGITS}


_Staged = TypeVar("_Staged", bound="_LogitsAndK")


@dataclasses.dataclass(frozen=True, repr=False)
class _LogitsAndK:
    """What both pipelines' cases are: a logits stage's case and the k of the top-k that consumes its logits."""

    logits: Case | RaggedCase
    k: int

    @property
    def name(self) -> str:
        return self.logits.name

    @property
    def rows(self) -> int:
        return self.logits.rows

    @property
    def device(self) -> torch.device:
        return self.logits.device

    def to(self: _Staged, device: str | torch.device) -> _Staged:
        """The same case on `device` (this case where it is there already)."""
        moved = self.logits.to(device)
        return self if moved is self.logits else dataclasses.replace(self, logits=moved)

    def describe(self) -> str:
        """The logits stage's case line and k."""
        return f"{self.logits.describe()} k={self.k}"

    def validate(self: _Staged) -> _Staged:
        """The logits stage's case checks, and k >= 1."""
        require(type(self.k) is int and self.k >= 1, "k", self.k, "an integer >= 1")
        self.logits.validate()
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.describe()})"


@dataclasses.dataclass(frozen=True, repr=False)
class IndexerCase(_LogitsAndK):
    """A paged decode case and the k of the top-k that consumes its logits."""

    logits: Case
    k: int

    def windows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(starts, ends) int64 [rows]: the window each logits row is ranked in (0, the row's limit)."""
        ends = self.logits.row_lens().reshape(-1)
        return torch.zeros_like(ends), ends

    def topk_case(self, storage: torch.Tensor, width: int | None = None) -> TopkCase:
        """The top-k problem of logits laid out in `storage` [rows, row_stride] (the first `width` columns of
        each row, max_model_len by default), over this case's windows."""
        starts, ends = self.windows()
        return TopkCase(name=self.name, storage=storage, width=width or self.logits.max_model_len, starts=starts,
                        ends=ends, k=self.k, next_n=self.logits.next_n)

    def shape_case(self) -> TopkCase:
        """The top-k problem's shape and windows without logits (a zero-stride storage): what a top-k
        contract's accepts() reads."""
        storage = torch.zeros((), dtype=torch.float32, device=self.device).expand(self.rows,
                                                                                  self.logits.max_model_len)
        return self.topk_case(storage)

    def save(self, path: str | Path) -> Path:
        """The paged case's archive (Case.save), k kept in its meta."""
        return dataclasses.replace(self.logits, meta={**self.logits.meta, K_META: self.k}).save(path)

    @classmethod
    def load(cls, path: str | Path) -> IndexerCase:
        """A case written by save(); SpecError when the archive is no paged case or keeps no k."""
        case = Case.load(path)
        k = case.meta.get(K_META)
        require(type(k) is int, f"{path} meta {K_META}", k, "the k of the top-k stage, an integer")
        logits = dataclasses.replace(case, meta={key: v for key, v in case.meta.items() if key != K_META})
        return cls(logits, k).validate()


@dataclasses.dataclass(frozen=True, repr=False)
class PrefillIndexerCase(_LogitsAndK):
    """A ragged prefill case and the k of the top-k that consumes its logits (vLLM's top_k_per_row_prefill:
    each row's k largest inside its key window)."""

    logits: RaggedCase
    k: int

    def windows(self, form: LogitsForm) -> tuple[torch.Tensor, torch.Tensor]:
        """(starts, ends) int64 [rows]: each row's key window in the columns of logits of `form` ([k_start,
        k_end) ABSOLUTE, [0, k_end - k_start) WINDOW_RELATIVE)."""
        if form == LogitsForm.ABSOLUTE:
            return self.logits.k_start, self.logits.k_end
        return torch.zeros_like(self.logits.k_start), self.logits.window_lens()

    def topk_case(self, storage: torch.Tensor, contract: RaggedContract) -> TopkCase:
        """The top-k problem of logits of `contract`'s form laid out in `storage` [rows, row_stride], over
        this case's windows."""
        starts, ends = self.windows(contract.form)
        return TopkCase(name=self.name, storage=storage, width=contract.width(self.logits), starts=starts,
                        ends=ends, k=self.k)

    def shape_case(self, contract: RaggedContract) -> TopkCase:
        """The top-k problem's shape and windows without logits (a zero-stride storage)."""
        width = contract.width(self.logits)
        return self.topk_case(torch.zeros((), dtype=torch.float32, device=self.device).expand(self.rows, width),
                              contract)

    def save(self, path: str | Path) -> Path:
        """The ragged case's archive (RaggedCase.save), k kept as its member TOPK_K_MEMBER."""
        return self.logits.save(path, **{TOPK_K_MEMBER: np.array(self.k, dtype=np.int64)})

    @classmethod
    def load(cls, path: str | Path) -> PrefillIndexerCase:
        """A case written by save(); SpecError when the archive is no ragged case or keeps no k (its member read
        through the archive's checks: an int64 scalar, in the top-k stage's [1, MAX_WIDTH])."""
        logits = RaggedCase.load(path)
        member = load_member(path, TOPK_K_MEMBER)
        k = None if member is None else int(member)
        require(k is not None and 1 <= k <= MAX_WIDTH, f"{path} member {TOPK_K_MEMBER}", k,
                f"the k of the top-k stage, an integer in [1, {MAX_WIDTH}]")
        return cls(logits, k).validate()


@dataclasses.dataclass(frozen=True)
class IndexerContract:
    """A composed indexer's conventions: its logits stage's and its top-k stage's, as each stage declares."""

    logits: Contract | RaggedContract
    topk: TopkContract

    @property
    def operation(self) -> OperationKind:
        """The indexer operation whose logits stage is the logits contract's operation (decode or prefill)."""
        return next(kind for kind, stage in LOGITS_STAGE.items() if stage == self.logits.operation)

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices both stages run on."""
        return tuple(device for device in self.logits.devices if device in self.topk.devices)

    @property
    def archs(self) -> tuple[str, ...] | None:
        """The GPU archs both stages take (None: any)."""
        if self.logits.archs is None or self.topk.archs is None:
            return self.logits.archs if self.topk.archs is None else self.topk.archs
        return tuple(arch for arch in self.logits.archs if arch in self.topk.archs)

    @property
    def library(self) -> str:
        """Both stages' libraries: 'deep_gemm 2.8.1 + torch 2.11'."""
        return f"{self.logits.library} + {self.topk.library}"

    def accepts(self, case: IndexerCase | PrefillIndexerCase, device: str) -> str | None:
        """Why either stage does not take the case on `device` (the stage named), or None when both do."""
        reason = self.logits.accepts(case.logits, device)
        if reason:
            return f"logits stage: {reason}"
        shape = case.shape_case(self.logits) if isinstance(case, PrefillIndexerCase) else case.shape_case()
        reason = self.topk.accepts(shape, device)
        return f"top-k stage: {reason}" if reason else None
