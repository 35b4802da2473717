"""sglang 0.5.23's torch reference for ragged (prefill) MQA logits, loaded from its file without importing sglang.

    _fp8_mqa_logits_torch(q_fp8, kv, weights, ks, ke, clean_logits=False, max_seqlen_k=0)
    sglang/srt/layers/attention/dsa/utils.py:465-495

What sglang's DSA prefill indexer runs with SGLANG_FP8_PAGED_MQA_LOGITS_TORCH set (resolve_fp8_mqa_logits_fn,
utils.py:499-504), called at srt/layers/attention/dsa/dsa_indexer.py:1608-1615 as
`(q, kv_fp8, weights, ks, ke, clean_logits=False)`, after padding the heads to 32 with zero weights where there are
fewer (_pad_heads_for_deep_gemm, :1174, for DeepGEMM's sake: zero-weight heads add nothing, so this backend passes the
heads as they are). It returns the [M, N] view of a zero-filled [M, align(N, 4)] float32 buffer with 0.0, not
-inf, outside each row's window (:483-495): ABSOLUTE, tail unspecified (its top-k masks by ks and ke).
Per-head dots in bf16 (torch.mm of bf16 q and k, :488-490): BF16_DOT_RTOL. The scale is applied after the head
sum, as DeepGEMM does. clean_logits=True is asserted against (:473).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from difftest.backends.ragged_base import BF16_DOT_RTOL, CarriedReference, RaggedBackend
from difftest.core.kinds import LogitsForm, MaskConvention
from difftest.core.ragged import RaggedContract, RaggedInputs

FILE = "sglang/srt/layers/attention/dsa/utils.py"


def _contract(library: str) -> RaggedContract:
    return RaggedContract(form=LogitsForm.ABSOLUTE, mask=MaskConvention.TAIL_UNSPECIFIED, rtol=BF16_DOT_RTOL,
                          library=library)


def _call(function: Callable[..., torch.Tensor], inputs: RaggedInputs) -> torch.Tensor:
    """dsa_indexer.py:1608-1615: positional q, (k, scale), weights, ks, ke; clean_logits=False by keyword."""
    return function(inputs.q, (inputs.k, inputs.k_scale), inputs.weights, inputs.k_start, inputs.k_end,
                    clean_logits=False)


def sglang_torch_ref() -> CarriedReference:
    """The backend `sglang-torch-ref-ragged`."""
    return CarriedReference(name="sglang-torch-ref-ragged", files=(FILE,), function="_fp8_mqa_logits_torch",
                            release="sglang 0.5.23", version_files=("sglang/_version.py",), contract_of=_contract,
                            call=_call)


RAGGED_BACKENDS: dict[str, Callable[[], RaggedBackend]] = {"sglang-torch-ref-ragged": sglang_torch_ref}
