"""What every backend is (the `Backend` protocol), where a loaded one came from (`Origin`), and the
two together (`Loaded`), which the engine takes anywhere it takes a Backend.

Nothing here imports torch: the CLI lists and parses without paying for it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from difftest.contract import Contract
    from difftest.kernel_inputs import KernelInputs


@runtime_checkable
class Backend(Protocol):
    """A kernel under test, called the way its production callers call it."""

    name: str
    contract: Contract

    def unavailable_reason(self, device: str) -> str | None:
        """Why this backend cannot run on `device` ("cpu", "cuda"), or None when it can."""
        ...

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [rows, max_model_len]; `out` is a poisoned buffer when contract.writes_into_output."""
        ...


@dataclasses.dataclass(frozen=True)
class Origin:
    """How a fresh process (a worker, a replay) rebuilds a backend.

    `target` is a registered name ('aiter-triton-stage1') or 'package.module:object'; None when
    nothing rebuilds this backend, and then `why_not` says why. `registered` tells the two kinds of
    target apart: a registered name is resolved through the registry, a module path is imported.
    """

    target: str | None
    registered: bool
    why_not: str = ""

    def describe(self) -> str:
        """One line for reports: what rebuilds the backend, or why nothing can."""
        if self.target is None:
            return f"cannot be rebuilt in a fresh process: {self.why_not}"
        return f"registered backend {self.target!r}" if self.registered else f"imported from {self.target!r}"


@dataclasses.dataclass(frozen=True, eq=False)
class Loaded:
    """A backend and its origin, recorded once when it was loaded.

    It is itself a Backend (by delegation), so the engine can take it wherever a Backend goes and
    still know how to rebuild it elsewhere. Compared by identity: two loads are two backends.
    """

    backend: Backend
    origin: Origin

    @property
    def name(self) -> str:
        """The backend's name."""
        return self.backend.name

    @property
    def contract(self) -> Contract:
        """The backend's contract, read afresh: some depend on the GPU present."""
        return self.backend.contract

    def unavailable_reason(self, device: str) -> str | None:
        """The backend's own reason."""
        return self.backend.unavailable_reason(device)

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The backend's call."""
        return self.backend(inputs, out)
