"""Backends: the Protocol every adapter satisfies, and the registry that finds them.

Adding a backend is one module here that defines a class satisfying `Backend` and one line in
BUILTIN; a user's own kernel comes in through `load_backend("pkg.mod:obj")` or the entry-point
group `difftest.backends` without touching difftest.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from difftest.contract import Contract
from difftest.encode import KernelInputs
from difftest.errors import SpecError

ENTRY_POINT_GROUP = "difftest.backends"


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


# name -> "module:factory"; imported only when asked for, so listing costs no kernel import.
BUILTIN: dict[str, str] = {
    "torch": "difftest.backends.torch_ref:TorchBackend",
    "deepgemm": "difftest.backends.deep_gemm:DeepGemmNative",
    "deepgemm-flattened": "difftest.backends.deep_gemm:DeepGemmFlattened",
    "deepgemm-varlen": "difftest.backends.deep_gemm:DeepGemmVarlen",
    "aiter-triton-stage1": "difftest.backends.aiter_triton:AiterTritonStage1",
    "aiter-triton-fused": "difftest.backends.aiter_triton:AiterTritonFused",
    "aiter-triton-stage1-ragged": "difftest.backends.aiter_triton:AiterTritonStage1Ragged",
    "aiter-triton-fused-ragged": "difftest.backends.aiter_triton:AiterTritonFusedRagged",
    "aiter-rocm-stage1": "difftest.backends.aiter_rocm:AiterRocmStage1",
    "aiter-rocm-fused": "difftest.backends.aiter_rocm:AiterRocmFused",
    "aiter-rocm-stage1-ragged": "difftest.backends.aiter_rocm:AiterRocmStage1Ragged",
    "aiter-rocm-fused-ragged": "difftest.backends.aiter_rocm:AiterRocmFusedRagged",
    "vllm-torch-ref": "difftest.backends.vllm_indexer:VllmTorchRef",
    "vllm-triton-decode": "difftest.backends.vllm_indexer:VllmTritonDecode",
    "vllm-deepgemm": "difftest.backends.vllm_indexer:VllmDeepGemm",
}


def _import_object(target: str, field: str) -> object:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SpecError(field, target, "'package.module:object'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(field, target, f"an importable module ({exc})") from exc
    if not hasattr(module, attr):
        raise SpecError(field, target, f"an object named {attr!r} in module {module_name!r}")
    return getattr(module, attr)


def as_backend(obj: object, field: str, target: str) -> Backend:
    """A Backend from an instance, a class or factory returning one, or a decorated function."""
    from difftest.backends.user import FunctionBackend

    if isinstance(obj, Backend) and not isinstance(obj, type):
        return obj
    if isinstance(getattr(obj, "difftest_contract", None), Contract):
        return FunctionBackend.from_function(obj)  # type: ignore[arg-type]
    if callable(obj) and _takes_no_arguments(obj):
        made = obj()
        if isinstance(made, Backend):
            return made
    raise SpecError(field, target, "a Backend, a factory of one, or a function decorated with "
                    "difftest.backend(contract=...)")


def _takes_no_arguments(obj: object) -> bool:
    """Whether `obj()` is a valid call: a factory, not a kernel function missing its decorator."""
    try:
        inspect.signature(obj).bind()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def load_backend(target: str, field: str = "--backend-module") -> Backend:
    """The backend named by 'package.module:object'."""
    return as_backend(_import_object(target, field), field, target)


def entry_point_backends() -> dict[str, str]:
    """name -> 'module:object' of backends other packages register under `difftest.backends`."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_names() -> dict[str, str]:
    """Every backend name difftest can load, built-in first."""
    return {**BUILTIN, **entry_point_backends()}


def get_backends(names: list[str] | None = None, modules: tuple[str, ...] = ()) -> list[Backend]:
    """The backends named (all registered ones when names is None) plus those from module paths."""
    known = available_names()
    chosen = list(known) if names is None else names
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise SpecError("--backends", ",".join(unknown), f"names among {sorted(known)}")
    loaded = [load_backend(known[n], f"backend {n!r}") for n in chosen]
    return loaded + [load_backend(m) for m in modules]


Factory = Callable[[], Backend]
