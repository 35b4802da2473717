"""DeepGEMM's ragged (prefill) MQA logits, called as vLLM 0.33's prefill indexer calls it (docs/reference/ragged.md).

    logits = fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k)

vLLM 0.33.0: model_executor/layers/sparse_attn_indexer.py:721-737 through vllm/utils/deep_gemm.py:638-681 (six
positional arguments, no schedule: sm90 takes none), then top_k_per_row_prefill(logits, 0, ke - ks, ...) on the
result with its strides. DeepGEMM 2.8.1 (vendored in that wheel) has no fp8_mqa_logits and no clean_logits: it
returns compressed logits, row i column j holding key ks[i] + j for j < ke[i] - ks[i], as the view
`[:M, :max_seqlen_k]` of rows padded to align(max_seqlen_k, 256) columns (and align(M, BLOCK_Q) rows); the tail
of each row is never written (torch::empty). difftest reads the view through its strides.

The envelope facts are those of the pinned DeepGEMM 2.8.1. Its host code is compiled into _C_extension.abi3.so;
"host" below cites csrc/apis/attention.hpp by the line its DWARF line table gives the assertion (the project's
research notes on the indexer operations, A1); "impl" cites include/deep_gemm/impls/sm90_fp8_mqa_logits.cuh in
the vendored tree. Vendored 0.34.0's entry point adds `logits_dtype` after max_seqlen_k (_C.py:180-181): the
six positional arguments bind the same in both.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

from difftest.backends import deep_gemm_library
from difftest.backends.ragged_base import RaggedBackend
from difftest.core import hardware
from difftest.core.kinds import LogitsForm, MaskConvention
from difftest.core.ragged import RaggedContract, RaggedInputs, RaggedTiles

ENTRY_POINTS = ("fp8_fp4_mqa_logits",)
# host :130-133, the sm90 branch: "num_heads == 32 or num_heads == 64".
SM90_HEADS = (32, 64)
# host :30: "(not is_fp4 and head_dim == 32) or head_dim == 64 or head_dim == 128".
HEAD_DIMS = (32, 64, 128)
# host :116 block_kv = 256 on sm90; impl:248 static_assert(BLOCK_KV == kNumMathThreads / 2): four math
# warpgroups of 64 keys each.
SM90_TILES = RaggedTiles(
    kv=(64, 256),
    # host :114 block_q = get_mqa_logits_block_q(num_heads) = 128 / H (jit_kernels/impls/sm100_mqa_logits.hpp:21-24).
    q_head_rows=128,
    # impl:135-139: a q block loads keys from min(ks) rounded down to a multiple of 4 (the scales' TMA alignment).
    start_align=4)
# FP8 MMA accumulates with ~14 bits: the paged kernel's largest error on the H200 was 3.0e-3 of the row's
# largest logit (difftest.backends.deep_gemm.RTOL); the ragged kernel runs the same WGMMA.
RTOL = 1e-2


def contract(library: str) -> RaggedContract:
    """DeepGEMM 2.8.1's sm90 ragged logits: compressed (window-relative) fp32 rows, tail not written. Windows
    longer than max_seqlen_k are outside it (RaggedContract.window_reason): the store (impl:305-310) has no bound
    against max_seqlen_k and runs into the next row, and no host check stops it."""
    return RaggedContract(form=LogitsForm.WINDOW_RELATIVE, mask=MaskConvention.TAIL_UNSPECIFIED, devices=("cuda",),
                          archs=("sm90",), heads=SM90_HEADS, head_dims=HEAD_DIMS, tiles=SM90_TILES, rtol=RTOL,
                          output_dtype=torch.float32, library=library)


def library_name() -> str:
    """The DeepGEMM found, for the contract's `library`."""
    return deep_gemm_library.library_name(ENTRY_POINTS)


def loaded_module() -> ModuleType:
    """The DeepGEMM found; RuntimeError saying why when none is."""
    return deep_gemm_library.loaded(ENTRY_POINTS)


class DeepGemmRagged:
    """fp8_fp4_mqa_logits on sm90, called as vLLM's prefill indexer calls it."""

    name = "deepgemm-ragged"

    @property
    def contract(self) -> RaggedContract:
        """The envelope; `library` names the DeepGEMM found (importing it once)."""
        return contract(library_name())

    def unavailable_reason(self, device: str) -> str | None:
        """Why it cannot run on `device`, most basic cause first; None when it can."""
        if device != "cuda":
            return f"DeepGEMM runs on CUDA GPUs only (device {device})"
        reason = hardware.cuda_unavailable_reason()
        if reason:
            return reason
        module, how = deep_gemm_library.find(ENTRY_POINTS)
        if module is None:
            return f"DeepGEMM with fp8_fp4_mqa_logits not importable ({how})"
        if hardware.arch() != "sm90":
            return f"{self.name} declares the sm90 kernel's envelope only, this GPU is {hardware.arch()}"
        return None

    def __call__(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Compressed logits [rows, max_seqlen_k] (a row-padded view); each row's tail is not written."""
        return self.prepare(inputs, out)()

    def prepare(self, inputs: RaggedInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The call itself: vLLM builds nothing once per step for it on sm90 (no schedule)."""
        assert inputs.max_seqlen_k is not None, "a window-relative form carries max_seqlen_k"
        entry = loaded_module().fp8_fp4_mqa_logits
        return lambda: entry((inputs.q, None), (inputs.k, inputs.k_scale), inputs.weights, inputs.k_start,
                             inputs.k_end, inputs.max_seqlen_k)


RAGGED_BACKENDS: dict[str, Callable[[], RaggedBackend]] = {"deepgemm-ragged": DeepGemmRagged}
