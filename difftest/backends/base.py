"""What every backend is (the `Backend` protocol), where a loaded one came from (`Origin`), and the
two together (`Loaded`), which the engine takes anywhere it takes a Backend. `Preparable` is the
optional split of a call into per-batch set-up and the per-layer kernel call, which `launcher` finds.

Nothing here imports torch: the CLI lists and parses without paying for it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from difftest.core.errors import SpecError
from difftest.core.kinds import TimedRegion
from difftest.core.schema import Bool, Name, Record, Text

if TYPE_CHECKING:
    import torch

    from difftest.core.contract import Contract
    from difftest.core.kernel_inputs import KernelInputs


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


@runtime_checkable
class Preparable(Protocol):
    """What a Backend may add (optional): its call split the way its production caller splits it, so
    `difftest run --time` times the per-layer kernel call and not the per-batch set-up."""

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """Build what the production caller builds once per batch (DeepGEMM's schedule metadata) and
        return the per-layer call: each call of it launches the kernel on `inputs` again, as
        `__call__(inputs, out)` would, and returns its logits."""
        ...


def rebuilt_every_step(backend: Backend) -> str | None:
    """Who rebuilds `backend`'s `prepare` set-up on every serving step, when its production caller does (a
    backend says so in a `rebuilt_every_step` attribute: vLLM rebuilds DeepGEMM's schedule metadata each step
    into the buffer its CUDA graph reads), else None: the set-up is made once, when the call is captured."""
    own = backend.backend if isinstance(backend, Loaded) else backend
    return getattr(own, "rebuilt_every_step", None)


def timed_region(backend: Backend) -> TimedRegion:
    """What timing `backend` covers: the per-layer call when it declares `prepare`, else (a user's
    function, say) the whole call."""
    own = backend.backend if isinstance(backend, Loaded) else backend
    return TimedRegion.KERNEL if isinstance(own, Preparable) else TimedRegion.WHOLE_CALL


def launcher(backend: Backend, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
    """The call to time: `prepare`'s per-layer call (its per-batch set-up done now), else the whole call."""
    own = backend.backend if isinstance(backend, Loaded) else backend
    if isinstance(own, Preparable):
        return own.prepare(inputs, out)
    return functools.partial(own, inputs, out)


@dataclasses.dataclass(frozen=True)
class Origin(Record):
    """How a fresh process (a worker, a replay) rebuilds a backend.

    `target` is a registered name ('aiter-triton-stage1') or 'package.module:object'; None when
    nothing rebuilds this backend, and then `why_not` says why. `registered` tells the two kinds of
    target apart: a registered name is resolved through the registry, a module path is imported.
    """

    what = "a JSON object {target, registered, why_not}"
    target: Name | None
    registered: Bool
    why_not: Text() = ""

    def checked(self) -> None:
        """A registered origin read from a bundle is a name the registry resolves; a 'module:object' path
        never is one (replay imports a path only when the bundle is trusted, difftest.workflows.replay)."""
        if self.registered and (self.target is None or ":" in self.target):
            raise SpecError("registered", True, f"false for the target {self.target!r}: only a registered "
                            "backend name (no ':') is registered")

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
