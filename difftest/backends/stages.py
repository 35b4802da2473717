"""The backends of each operation other than paged logits, by operation: the RAGGED_BACKENDS tables of the
ragged (prefill) logits modules, the TOPK_BACKENDS tables of the top-k modules, and the compositions the
indexer operation runs (a logits backend followed by a top-k backend, named by their names: data, not
classes). The paged-logits backends are the registry's (difftest.backends.registry). Building a table imports
no kernel library: each backend loads its library when it is first asked whether it runs.
"""

from __future__ import annotations

import dataclasses
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

RAGGED_TABLES = (deep_gemm_ragged.RAGGED_BACKENDS, vllm_ragged.RAGGED_BACKENDS, sglang_ragged.RAGGED_BACKENDS,
                 aiter_ragged.RAGGED_BACKENDS)
TOPK_TABLES = (torch_topk.TOPK_BACKENDS, flaggems_topk.TOPK_BACKENDS, vllm_topk.TOPK_BACKENDS,
               sglang_topk.TOPK_BACKENDS, flashinfer_topk.TOPK_BACKENDS)


@dataclasses.dataclass(frozen=True)
class Composition:
    """An indexer as a serving engine composes it: the ragged logits backend `logits`, then the top-k
    backend `topk` on its output (both names of the tables above)."""

    name: str
    logits: str
    topk: str


# vLLM's prefill path (DeepGEMM fp8_mqa_logits, then top_k_per_row_prefill), SGLang's (its torch reference
# logits, then its torch top-k), and the torch references end to end.
COMPOSITIONS = (
    Composition("deepgemm-ragged+vllm-top-k-per-row-prefill", "deepgemm-ragged", "vllm-top-k-per-row-prefill"),
    Composition("deepgemm-ragged+torch-topk", "deepgemm-ragged", "torch-topk"),
    Composition("vllm-torch-ref-ragged+torch-topk", "vllm-torch-ref-ragged", "torch-topk"),
    Composition("sglang-torch-ref-ragged+torch-topk", "sglang-torch-ref-ragged", "torch-topk"),
    Composition("aiter-triton-ragged+torch-topk", "aiter-triton-ragged", "torch-topk"),
)


def ragged_backends() -> dict[str, Callable[[], Any]]:
    """name -> factory of every ragged logits backend."""
    return {name: make for table in RAGGED_TABLES for name, make in table.items()}


def topk_backends() -> dict[str, Callable[[], Any]]:
    """name -> factory of every top-k backend."""
    return {name: make for table in TOPK_TABLES for name, make in table.items()}
