"""Case generators: seeded bulk drawing (tensors), curated edges (cases), and, opt-in, hypothesis
strategies (`generators.strategies`, which imports hypothesis).

The names below are imported on first use (PEP 562), so `import generators` imports neither torch
nor hypothesis.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CaseSpec": "generators.spec", "LengthDist": "generators.spec", "Stale": "generators.spec",
    "Values": "generators.spec", "case_name": "generators.spec",
    "default_specs": "generators.cases", "edge_cases": "generators.cases",
    "build_case": "generators.tensors", "random_cases": "generators.tensors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the module that defines `name` on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'generators' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
