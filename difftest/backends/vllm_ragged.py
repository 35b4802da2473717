"""vLLM 0.33.0's torch reference for ragged (prefill) MQA logits, loaded from its file without importing vllm.

    fp8_mqa_logits_torch(q, kv=(k_fp8, scale), weights, cu_seqlen_ks, cu_seqlen_ke)
    vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:872-921

What vLLM's ROCm prefill indexer runs when AITER is not enabled: rocm_fp8_mqa_logits (:941-987), called at
:1294-1300 with q and weights of a chunk's tokens, (k_fp8, k_scale as float32) and the chunk's cu_seqlen_ks and
cu_seqlen_ke, falls back to it. It returns [M, N] float32 with -inf outside each row's window (:903-919):
ABSOLUTE, cleaned. Two conventions of its own, both allowed by difftest's cases:
* each head's dot is an einsum in bf16 (q and k cast fp8 -> bf16, the product rounded to bf16): the rtol of
  difftest.backends.ragged_base.BF16_DOT_RTOL;
* the key scale is applied before the ReLU, relu(q . k * s) (:917-918), which equals DeepGEMM's
  relu(q . k) * s only for s > 0 (every key a window holds has one: RaggedCase.validate).
Its [H, M, N] fp32 scores make it a small-case reference: difftest runs it on the CPU suite.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from difftest.backends.ragged_base import BF16_DOT_RTOL, CarriedReference, RaggedBackend
from difftest.core.kinds import LogitsForm, MaskConvention
from difftest.core.ragged import RaggedContract, RaggedInputs

FILE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"


def _contract(library: str) -> RaggedContract:
    # Any heads and head dim (einsum); e4m3fn q and keys (its docstring: "Casted to torch.float8_e4m3fn by caller").
    return RaggedContract(form=LogitsForm.ABSOLUTE, mask=MaskConvention.TAIL_NEG_INF, rtol=BF16_DOT_RTOL,
                          library=library)


def _call(function: Callable[..., torch.Tensor], inputs: RaggedInputs) -> torch.Tensor:
    """rocm_fp8_mqa_logits' fallback call (:987): positional, the scale tensor as float32."""
    return function(inputs.q, (inputs.k, inputs.k_scale), inputs.weights, inputs.k_start, inputs.k_end)


def vllm_torch_ref() -> CarriedReference:
    """The backend `vllm-torch-ref-ragged`."""
    return CarriedReference(name="vllm-torch-ref-ragged", files=(FILE,), function="fp8_mqa_logits_torch",
                            release="vllm 0.33.0", version_files=("vllm/_version.py",), contract_of=_contract,
                            call=_call)


RAGGED_BACKENDS: dict[str, Callable[[], RaggedBackend]] = {"vllm-torch-ref-ragged": vllm_torch_ref}
