"""What a top-k backend is (the sibling of difftest.backends.base.Backend for the top-k operation), and where
the compiled top-k kernels' carried files are.

Nothing here imports torch: listing backends stays light.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from difftest.core.topk import TopkContract, TopkInputs


@runtime_checkable
class TopkBackend(Protocol):
    """A top-k kernel under test, called the way its production callers call it. Its TopkContract declares the
    operation (TopkContract.operation), so the registry takes any object of this shape, built in or a user's
    'package.module:object' (difftest.backends.registry.load_operation_backend)."""

    name: str
    contract: TopkContract

    def unavailable_reason(self, device: str) -> str | None:
        """Why this backend cannot run on `device` ("cpu", "cuda"), or None when it can."""
        ...

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Indices [rows, k] in the contract's index convention and padding; `out` is unused today (every
        kernel of the field allocates, or its caller pre-fills, its own index buffer)."""
        ...


DEPS_VARIABLE = "DIFFTEST_TOPK_DEPS"
DEFAULT_DEPS = ".device-deps/topk"  # relative to the project root, where scripts/prepare_topk_deps.sh writes
# The folder holding the difftest package: the project checkout (or, installed, its site-packages).
_INSTALLATION = Path(__file__).resolve().parents[2]


def deps_dir() -> Path:
    """Where the compiled top-k kernels' carried files are: $DIFFTEST_TOPK_DEPS, else .device-deps/topk of the
    installation (the project checkout beside the difftest package). Never the working folder: a replay run
    from a folder holding a planted .device-deps/topk/ would load its libraries."""
    return Path(os.environ.get(DEPS_VARIABLE) or _INSTALLATION / DEFAULT_DEPS)
