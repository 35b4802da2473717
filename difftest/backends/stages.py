"""The backends of each operation other than paged logits, by operation: the RAGGED_BACKENDS tables of the
ragged (prefill) logits modules, the TOPK_BACKENDS tables of the top-k modules, and the compositions the
indexer operations run (a paged or ragged logits backend followed by a top-k backend, named by their names:
data, not classes; difftest.operations.indexer builds them). The paged-logits backends are the registry's
(difftest.backends.registry). Building a table imports no kernel library: each backend loads its library when
it is first asked whether it runs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from difftest.backends import (
    aiter_ragged,
    deep_gemm_ragged,
    flaggems_topk,
    flashinfer_topk,
    sglang_ragged,
    sglang_topk,
    torch_topk,
    vllm_ragged,
    vllm_topk,
)
from difftest.backends.base import Loaded
from difftest.core.indexer import IndexerContract

RAGGED_TABLES = (deep_gemm_ragged.RAGGED_BACKENDS, vllm_ragged.RAGGED_BACKENDS, sglang_ragged.RAGGED_BACKENDS,
                 aiter_ragged.RAGGED_BACKENDS)
TOPK_TABLES = (torch_topk.TOPK_BACKENDS, flaggems_topk.TOPK_BACKENDS, vllm_topk.TOPK_BACKENDS,
               sglang_topk.TOPK_BACKENDS, flashinfer_topk.TOPK_BACKENDS)


@dataclasses.dataclass(frozen=True)
class Composition:
    """An indexer step as a serving engine composes it: the logits backend `logits` (a paged one of the
    registry's in COMPOSITIONS, a ragged one of RAGGED_TABLES in PREFILL_COMPOSITIONS), then the top-k backend
    `topk` (a name of TOPK_TABLES) on the logits it wrote."""

    logits: str
    topk: str

    @property
    def name(self) -> str:
        """'deepgemm+vllm-persistent-topk': the composition's backend name."""
        return f"{self.logits}+{self.topk}"


# vLLM 0.33.0's decode paths on the H200 (DeepGEMM's paged logits, then cooperative_topk up to 64 rows,
# persistent_topk beyond, top_k_per_row_decode as the last resort, or its torch debug reference), DeepGEMM
# with SGLang's torch top-k, and the torch references end to end (the compositions the CPU runs); its ROCm
# path (AITER's paged logits, fused or stage 1, then top_k_per_row_decode), and AITER's Triton kernels with the
# torch top-k, which a bare CPU runs under the interpreter.
COMPOSITIONS = (
    Composition("deepgemm", "vllm-cooperative-topk"),
    Composition("deepgemm", "vllm-persistent-topk"),
    Composition("deepgemm", "vllm-top-k-per-row-decode"),
    Composition("deepgemm", "torch-topk-vllm"),
    Composition("deepgemm", "torch-topk"),
    Composition("deepgemm-flattened", "vllm-persistent-topk"),
    Composition("torch", "torch-topk"),
    Composition("torch", "torch-topk-vllm"),
    Composition("aiter-triton-fused", "vllm-top-k-per-row-decode"),
    Composition("aiter-triton-stage1", "vllm-top-k-per-row-decode"),
    Composition("aiter-triton-fused", "torch-topk"),
    Composition("aiter-triton-stage1", "torch-topk"),
)

# vLLM 0.33.0's prefill paths: on CUDA DeepGEMM's ragged logits, on ROCm AITER's (rocm_fp8_mqa_logits), each
# then top_k_per_row_prefill over each row's window; each logits kernel with the torch top-k; the torch
# references end to end. AITER's Triton kernel with the torch top-k is the one a bare CPU runs (the interpreter).
PREFILL_COMPOSITIONS = (
    Composition("deepgemm-ragged", "vllm-top-k-per-row-prefill"),
    Composition("deepgemm-ragged", "torch-topk"),
    Composition("aiter-triton-ragged", "vllm-top-k-per-row-prefill"),
    Composition("aiter-triton-ragged", "torch-topk"),
    Composition("vllm-torch-ref-ragged", "torch-topk"),
    Composition("sglang-torch-ref-ragged", "torch-topk"),
)


@dataclasses.dataclass
class Composed:
    """A logits backend and a top-k backend run one after the other: one backend of an indexer operation (its
    contract says which: a paged logits stage makes the decode indexer, a ragged one the prefill indexer)."""

    name: str
    logits: Any  # a paged (difftest.backends.base.Backend) or ragged (RaggedBackend) logits backend
    topk: Any  # a TopkBackend

    @functools.cached_property
    def contract(self) -> IndexerContract:
        """Both stages' contracts."""
        return IndexerContract(self.logits.contract, self.topk.contract)

    def unavailable_reason(self, device: str) -> str | None:
        """Why either stage cannot run on `device` (the stage named), or None when both can."""
        for stage, backend in (("logits", self.logits), ("top-k", self.topk)):
            reason = backend.unavailable_reason(device)
            if reason:
                return f"{stage} stage {backend.name}: {reason}"
        return None


def composed(backend: Composed | Loaded) -> Composed:
    """The Composed `backend` is, or the one it holds when loaded (its stages are what the operation calls)."""
    return backend.backend if isinstance(backend, Loaded) else backend


def ragged_backends() -> dict[str, Callable[[], Any]]:
    """name -> factory of every ragged logits backend."""
    return {name: make for table in RAGGED_TABLES for name, make in table.items()}


def topk_backends() -> dict[str, Callable[[], Any]]:
    """name -> factory of every top-k backend."""
    return {name: make for table in TOPK_TABLES for name, make in table.items()}
