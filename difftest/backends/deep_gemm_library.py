"""Finding DeepGEMM, for every backend that calls one of its entry points (difftest.backends.deep_gemm for
paged logits, difftest.backends.deep_gemm_ragged for ragged ones): the standalone `deep_gemm`, else the copy a
vllm wheel vendors as `vllm.third_party.deep_gemm` (the order vLLM's own _import_deep_gemm tries them), the
first that has the entry point asked for.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from types import ModuleType

MODULES = ("deep_gemm", "vllm.third_party.deep_gemm")


@functools.cache
def find(entry_points: tuple[str, ...]) -> tuple[ModuleType | None, str]:
    """(the first of MODULES that imports and has one of `entry_points`, how it was found) or (None, why not)."""
    errors = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # a broken build raises more than ImportError
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if any(hasattr(module, entry) for entry in entry_points):
            return module, describe(name, module)
        errors.append(f"{name}: has no {' or '.join(entry_points)}")
    return None, "; ".join(errors)


def describe(name: str, module: ModuleType) -> str:
    """'deep_gemm 2.8.1 (/tmp/versions/deep_gemm-0.33.0/deep_gemm)': the version and the folder it was
    imported from, which tells apart trees of one version (vllm 0.30.0's and 0.31.0's are both 2.8.0,
    with other builds of the host code)."""
    version = getattr(module, "__version__", "?")
    where = getattr(module, "__file__", None)
    return f"{name} {version} ({Path(where).parent})" if where else f"{name} {version}"


def library_name(entry_points: tuple[str, ...]) -> str:
    """The DeepGEMM found for `entry_points`, for a contract's `library`."""
    module, how = find(entry_points)
    return how if module is not None else "deep_gemm (not importable)"


def loaded(entry_points: tuple[str, ...]) -> ModuleType:
    """The DeepGEMM found for `entry_points`; RuntimeError saying why when none is."""
    module, how = find(entry_points)
    if module is None:
        raise RuntimeError(f"DeepGEMM not importable: {how}")
    return module
