"""AITER's own Python wrappers of its paged MQA logits kernels, on ROCm: what a ROCm caller imports.

    from aiter.ops.triton.pa_mqa_logits import deepgemm_fp8_paged_mqa_logits  # 0.1.7.x
    from aiter.ops.triton.attention.pa_mqa_logits import ...                   # newer AITER

The wrappers import `aiter.dtypes`, which needs AITER's ROCm build, and view the cache bytes as the
GPU's native fp8 (`dtypes.fp8`: e4m3fnuz on gfx942, e4m3fn on gfx950), so these backends run only
on a ROCm build of torch with AITER installed; elsewhere they skip with the reason. The kernels
behind them are the ones `aiter_triton` launches directly (where the findings of
docs/findings/aiter-triton-mask.md apply); this path adds AITER's own argument handling and the
gfx942 fp8 flavour that the direct launch cannot give. Outputs are pre-filled with -inf as AITER's
test and vLLM's stage1 call do. amd-aiter 0.1.7.post2.dev18 has no Gluon paged-MQA kernel (its only
Gluon kernel is a GEMM), so there is none to adapt here.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from collections.abc import Callable
from types import ModuleType

import torch

from difftest.backends.aiter_triton import VARIANTS as KERNELS
from difftest.backends.aiter_triton import KernelVariant, kernel_contract
from difftest.backends.base import Backend
from difftest.core import hardware
from difftest.core.contract import Contract
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import Fp8Flavour

WRAPPER_MODULES = ("aiter.ops.triton.pa_mqa_logits", "aiter.ops.triton.attention.pa_mqa_logits")


@dataclasses.dataclass(frozen=True)
class Wrapper:
    """One of AITER's wrapper functions and the kernel it launches."""

    function: str  # its name in the wrapper module
    variant: KernelVariant  # the kernel it launches: what it reads and writes


WRAPPERS: dict[str, Wrapper] = {
    "aiter-rocm-stage1": Wrapper("deepgemm_fp8_paged_mqa_logits_stage1", KERNELS["aiter-triton-stage1"]),
    "aiter-rocm-fused": Wrapper("deepgemm_fp8_paged_mqa_logits", KERNELS["aiter-triton-fused"]),
    "aiter-rocm-stage1-ragged": Wrapper("deepgemm_fp8_paged_mqa_logits_stage1_ragged_k",
                                        KERNELS["aiter-triton-stage1-ragged"]),
    "aiter-rocm-fused-ragged": Wrapper("deepgemm_fp8_paged_mqa_logits_ragged_k", KERNELS["aiter-triton-fused-ragged"]),
}


def load_wrappers() -> tuple[ModuleType | None, str]:
    """(the wrapper module, its name) or (None, why not), trying 0.1.7's path first, as vLLM does."""
    errors = []
    for name in WRAPPER_MODULES:
        try:
            return importlib.import_module(name), name
        except Exception as exc:  # aiter's __init__ raises more than ImportError off ROCm
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    return None, "; ".join(errors)


def native_fp8() -> Fp8Flavour:
    """The fp8 flavour `aiter.dtypes.fp8` is on this GPU: e4m3fnuz on gfx942, e4m3fn elsewhere."""
    if hardware.is_rocm() and hardware.cuda_unavailable_reason() is None and hardware.arch() == "gfx942":
        return Fp8Flavour.E4M3FNUZ
    return Fp8Flavour.E4M3FN


class AiterRocm:
    """One of AITER's wrappers (WRAPPERS[name]), called as a ROCm caller calls it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.wrapper = WRAPPERS[name]

    @property
    def contract(self) -> Contract:
        """The kernel's contract (aiter_triton), envelope included, on ROCm GPUs only and in the
        GPU's own fp8 flavour."""
        return dataclasses.replace(kernel_contract(self.wrapper.variant), devices=("cuda",), fp8=native_fp8())

    def unavailable_reason(self, device: str) -> str | None:
        """Why AITER's wrappers cannot run on `device`, most basic cause first; None when they can."""
        if device != "cuda":
            return f"AITER's wrappers run on ROCm GPUs only (device {device})"
        if not hardware.is_rocm():
            return "AITER's wrappers need a ROCm build of torch (torch.version.hip is None)"
        reason = hardware.cuda_unavailable_reason()
        if reason:
            return reason
        module, how = load_wrappers()
        if module is None:
            return f"AITER's wrappers are not importable ({how})"
        if not hasattr(module, self.wrapper.function):
            return f"{how} has no {self.wrapper.function}"
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [rows, max_model_len] float32, through the wrapper; `out` is unused."""
        module, _ = load_wrappers()
        batch, next_n, heads, _ = inputs.q.shape
        rows = batch * next_n
        per_head = self.wrapper.variant.per_head
        shape = (heads, rows, inputs.max_model_len) if per_head else (rows, inputs.max_model_len)
        buffer = torch.full(shape, -math.inf, dtype=torch.float32, device=inputs.q.device)
        getattr(module, self.wrapper.function)(inputs.q, inputs.kv_cache, inputs.weights, buffer,
                                               inputs.context_lens, inputs.block_table, inputs.max_model_len)
        return buffer.sum(dim=0) if per_head else buffer

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The whole call: a ROCm caller builds nothing once per batch for these wrappers; it fills its
        buffer, calls the wrapper and (stage1) sums over heads every layer (Preparable)."""
        return functools.partial(self, inputs, out)


BACKENDS: dict[str, Callable[[], Backend]] = {name: functools.partial(AiterRocm, name) for name in WRAPPERS}
