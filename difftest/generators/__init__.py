"""Case generators: seeded bulk drawing (tensors), curated edges (cases), and, opt-in, hypothesis
strategies (`difftest.generators.strategies`, which imports hypothesis).

The names below are imported on first use (PEP 562), so `import difftest.generators` imports neither torch
nor hypothesis.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CaseSpec": "difftest.core.spec", "LengthDist": "difftest.core.spec",
    "Stale": "difftest.core.spec", "Values": "difftest.core.spec", "case_name": "difftest.core.spec",
    "default_specs": "difftest.generators.cases", "edge_cases": "difftest.generators.cases",
    "build_case": "difftest.generators.tensors", "build_cases": "difftest.generators.tensors",
    "random_cases": "difftest.generators.tensors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the module that defines `name` on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'difftest.generators' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
