"""A user's own kernel as a backend: a plain function with DeepGEMM's calling convention."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol, TypeVar

import torch

from difftest.core.contract import Contract
from difftest.core.kernel_inputs import KernelInputs


class PagedMqaLogitsFn(Protocol):
    """fn(q, kv_cache, weights, context_lens, block_table, max_model_len) -> logits [rows, max_model_len]."""

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                 context_lens: torch.Tensor, block_table: torch.Tensor, max_model_len: int) -> torch.Tensor: ...


F = TypeVar("F", bound=Callable[..., torch.Tensor])


def backend(contract: Contract, name: str | None = None) -> Callable[[F], F]:
    """Decorator declaring a function's contract so `load_backend("pkg.mod:fn")` (or as_loaded(fn))
    can load it."""

    def mark(fn: F) -> F:
        fn.difftest_contract = contract  # type: ignore[attr-defined]
        fn.difftest_name = name or fn.__name__  # type: ignore[attr-defined]
        return fn

    return mark


@dataclasses.dataclass
class FunctionBackend:
    """Adapts a PagedMqaLogitsFn with a declared Contract to the Backend protocol."""

    name: str
    contract: Contract
    fn: PagedMqaLogitsFn

    @classmethod
    def from_function(cls, fn: Callable[..., torch.Tensor]) -> FunctionBackend:
        return cls(name=getattr(fn, "difftest_name", fn.__name__), contract=fn.difftest_contract, fn=fn)  # type: ignore[attr-defined]

    def unavailable_reason(self, device: str) -> str | None:
        if device not in self.contract.devices:
            return f"{self.name} declares devices {list(self.contract.devices)}, not {device}"
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        return self.fn(inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens,
                       inputs.block_table, inputs.max_model_len)
