"""A user's own kernel as a backend: a plain function, called with its operation's plain calling convention.

    paged logits   fn(q, kv_cache, weights, context_lens, block_table, max_model_len) -> logits
                   (DeepGEMM's fp8_paged_mqa_logits, KernelInputs' fields)
    ragged logits  fn(q, k, k_scale, weights, k_start, k_end) -> logits, and max_seqlen_k=... by keyword under
                   a WINDOW_RELATIVE contract (RaggedInputs' fields; DeepGEMM's fp8_mqa_logits with the key
                   scale apart)
    top-k          fn(logits, k, **windows) -> indices [rows, k]: the windows by keyword, in the contract's
                   WindowForm (TopkInputs' fields): row_starts and row_ends (STARTS_ENDS), row_starts and lengths
                   (STARTS_LENGTHS), lengths (LENGTHS), seq_lens and next_n (DECODE_RULE)

The function's contract says which: `@difftest.backend(contract)` with a Contract, a RaggedContract or a
TopkContract. An indexer is composed of two stages ('LOGITS+TOPK', difftest.backends.registry), not decorated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

from difftest.core.contract import Contract
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import OperationKind
from difftest.core.ragged import RaggedContract, RaggedInputs
from difftest.core.topk import TopkContract, TopkInputs


class PagedMqaLogitsFn(Protocol):
    """fn(q, kv_cache, weights, context_lens, block_table, max_model_len) -> logits [rows, max_model_len]."""

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                 context_lens: torch.Tensor, block_table: torch.Tensor, max_model_len: int) -> torch.Tensor: ...


F = TypeVar("F", bound=Callable[..., torch.Tensor])
StageContract = Contract | RaggedContract | TopkContract
# The top-k window arguments, each passed by keyword when the contract's window form uses it (not None).
_WINDOW_FIELDS = ("row_starts", "row_ends", "lengths", "seq_lens")


def backend(contract: StageContract, name: str | None = None) -> Callable[[F], F]:
    """Decorator declaring a function's contract (a paged Contract, a RaggedContract or a TopkContract: which
    operation it is a kernel of, and how it is called) so `load_backend("pkg.mod:fn")`, `--backends
    pkg.mod:fn` for any operation, or as_loaded(fn) can load it."""

    def mark(fn: F) -> F:
        fn.difftest_contract = contract  # type: ignore[attr-defined]
        fn.difftest_name = name or fn.__name__  # type: ignore[attr-defined]
        return fn

    return mark


def _paged(fn: Callable[..., torch.Tensor], inputs: KernelInputs) -> torch.Tensor:
    return fn(inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens, inputs.block_table,
              inputs.max_model_len)


def _ragged(fn: Callable[..., torch.Tensor], inputs: RaggedInputs) -> torch.Tensor:
    width = {} if inputs.max_seqlen_k is None else {"max_seqlen_k": inputs.max_seqlen_k}
    return fn(inputs.q, inputs.k, inputs.k_scale, inputs.weights, inputs.k_start, inputs.k_end, **width)


def _topk(fn: Callable[..., torch.Tensor], inputs: TopkInputs) -> torch.Tensor:
    windows: dict[str, Any] = {f: getattr(inputs, f) for f in _WINDOW_FIELDS if getattr(inputs, f) is not None}
    if inputs.seq_lens is not None:
        windows["next_n"] = inputs.next_n
    return fn(inputs.logits, inputs.k, **windows)


CALLING_CONVENTIONS: dict[OperationKind, Callable[[Callable[..., torch.Tensor], Any], torch.Tensor]] = {
    OperationKind.PAGED_LOGITS: _paged, OperationKind.RAGGED_LOGITS: _ragged, OperationKind.TOPK: _topk}


@dataclasses.dataclass
class FunctionBackend:
    """Adapts a decorated function to the backend protocol of its contract's operation."""

    name: str
    contract: StageContract
    fn: Callable[..., torch.Tensor]

    @classmethod
    def from_function(cls, fn: Callable[..., torch.Tensor]) -> FunctionBackend:
        """The backend of a function decorated with difftest.backend(contract)."""
        return cls(name=getattr(fn, "difftest_name", fn.__name__), contract=fn.difftest_contract, fn=fn)  # type: ignore[attr-defined]

    def unavailable_reason(self, device: str) -> str | None:
        """Why the function cannot run on `device`: a device its contract does not list."""
        if device not in self.contract.devices:
            return f"{self.name} declares devices {list(self.contract.devices)}, not {device}"
        return None

    def __call__(self, inputs: Any, out: torch.Tensor | None) -> torch.Tensor:
        """The function on the inputs, in its operation's calling convention (`out` is not handed on)."""
        return CALLING_CONVENTIONS[self.contract.operation](self.fn, inputs)
