"""difftest: proves or disproves, row by row, that a paged MQA logits kernel computes what it should.

Cases (generators) go through the oracle and every backend; the comparison reports, per row, a
wrong -inf mask, NaN, unwritten output or a value error, under each backend's declared contract.
Documentation: docs/README.md in the repository.

The names below are imported on first use (PEP 562), so `import difftest.core.errors` or the pytest
plugin costs no torch import.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# public name -> the module that defines it
_EXPORTS = {
    "Backend": "difftest.backends", "get_backends": "difftest.backends", "load_backend": "difftest.backends",
    "backend": "difftest.backends.user",
    "Case": "difftest.core.case",
    "check": "difftest.workflows.checking",
    "Comparison": "difftest.engine.comparison", "compare": "difftest.engine.comparison",
    "RunConfig": "difftest.engine.config",
    "Contract": "difftest.core.contract", "Siblings": "difftest.core.contract",
    "WorkPartition": "difftest.core.contract", "WorkingMemory": "difftest.core.contract",
    "KernelInputs": "difftest.core.kernel_inputs", "encode": "difftest.core.kernel_inputs",
    "SpecError": "difftest.core.errors",
    "CacheLayout": "difftest.core.kinds", "Fp8Flavour": "difftest.core.kinds", "LengthEncoding": "difftest.core.kinds",
    "MaskConvention": "difftest.core.kinds", "PartitionScope": "difftest.core.kinds",
    "CaseResult": "difftest.engine.result",
    "run": "difftest.workflows.running",
    "Verdict": "difftest.core.verdict",
}

__all__ = sorted(_EXPORTS)

try:
    __version__ = version("difftest")
except PackageNotFoundError:  # a plain checkout on sys.path, not installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    """Import the module that defines `name` on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'difftest' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
