"""vLLM 0.33's own paged MQA logits paths, called the way its sparse-attention indexer calls them.

Three backends, all optional: they load only when `vllm` imports (the `vllm` extra).

* vllm-torch-ref      vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:
                      fp8_paged_mqa_logits_torch(q, kv_cache, weights, context_lens, block_tables, max_model_len)
                      A per-sequence, per-block torch loop: ROCm's fallback when AITER is missing, and for
                      block-flat (C4A) caches whose block size is not a multiple of 64. A peer oracle (CPU, GPU).
* vllm-triton-decode  same file: rocm_fp8_paged_mqa_logits_triton(q, kv_cache, weights, context_lens,
                      block_tables, max_model_len): vLLM's Triton decode kernel for block-flat caches (block
                      size a multiple of 64; production reaches it on gfx942/gfx950 for C4A caches), writing
                      into a workspace buffer. GPU only: without a GPU driver vLLM swaps Triton for a placeholder.
* vllm-deepgemm       vllm/utils/deep_gemm.py: get_paged_mqa_logits_metadata(context_lens, block_size, num_sms),
                      then fp8_fp4_paged_mqa_logits((q, q_scale), kv_cache, weights, context_lens, block_tables,
                      schedule, max_model_len, indices=None): the CUDA decode path over DeepGEMM. The wrapper
                      halves the schedule slots itself for sm90 next_n = 4 (callers pass the full SM count).

Lengths: vLLM's metadata builder (vllm/v1/attention/backends/mla/indexer.py, _prepare_decode_tensors
and build) hands all three the per-row table: (B, next_n) with len = max(L - next_n + j + 1, 0) on
the native MTP path, and (B, 1) at next_n = 1 (it unsqueezes the 1-D lengths "so downstream kernels
see the same (B, next_n) layout"). Cache: vLLM's indexer writers store each block's keys, then its
fp32 scales (block-split); so do the three readers here, except that fp8_paged_mqa_logits_torch
slices `kv_cache[..., :D]` and `kv_cache[..., D:]` (token-interleaved) whenever next_n > 1, which
tests/difftest/backends/test_vllm.py pins down.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from types import ModuleType

import torch

from difftest.backends.deep_gemm import SM90_NATIVE_NEXT_N, arch, load_deep_gemm
from difftest.contract import Contract
from difftest.encode import KernelInputs
from difftest.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention

OPS = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
DEEP_GEMM = "vllm.utils.deep_gemm"
WORKSPACE = "vllm.v1.worker.workspace"
TRITON_UTILS = "vllm.triton_utils"
PLATFORM_UTILS = "vllm.utils.platform_utils"
TRITON_BLOCK_KV = 64  # rocm_fp8_paged_mqa_logits_triton asserts block_size % BLOCK_KV == 0


@functools.cache
def load(module: str) -> tuple[ModuleType | None, str | None]:
    """(the module, None), or (None, why not): vllm itself first, so a missing vllm reads as such."""
    try:
        importlib.import_module("vllm")
    except Exception as exc:  # a broken install raises more than ImportError
        return None, f"vllm not importable: {type(exc).__name__}: {exc}"
    try:
        return importlib.import_module(module), None
    except Exception as exc:
        return None, f"{module} not importable (vllm {vllm_version()}): {type(exc).__name__}: {exc}"


def vllm_version() -> str | None:
    """The installed vllm distribution's version, read without importing vllm; None if not installed."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _library(entry: str) -> str:
    version = vllm_version()
    return f"vllm {version} ({entry})" if version else f"vllm (not installed; {entry})"


def _module(name: str) -> ModuleType:
    module, why = load(name)
    if module is None:
        raise RuntimeError(why)
    return module


def _fp8_flavour() -> Fp8Flavour:
    """The fp8 bytes vLLM's ops module reads (its FP8_DTYPE: e4m3fnuz on gfx94x, e4m3fn elsewhere)."""
    module, _ = load(OPS)
    if module is not None and module.FP8_DTYPE == torch.float8_e4m3fnuz:
        return Fp8Flavour.E4M3FNUZ
    return Fp8Flavour.E4M3FN


def _cuda_reason(device: str, what: str) -> str | None:
    if device != "cuda":
        return f"{what} runs on GPUs only (device {device})"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None


class VllmTorchRef:
    """`vllm-torch-ref`: fp8_paged_mqa_logits_torch, a plain-torch peer of difftest's oracle."""

    name = "vllm-torch-ref"

    @property
    def contract(self) -> Contract:
        return Contract(
            length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
            # It starts from a -inf buffer and writes -inf past each row's limit.
            mask=MaskConvention.TAIL_NEG_INF, fp8=_fp8_flavour(), output_dtype=torch.float32,
            # float32 dot products and head sums: at most 1.1e-6 of the row's largest logit over the
            # default suite and the edges, next_n 1-4, on the CPU (2026-12-02).
            rtol=1e-5, devices=("cpu", "cuda"), library=_library("fp8_paged_mqa_logits_torch"))

    def unavailable_reason(self, device: str) -> str | None:
        _, why = load(OPS)
        if why:
            return why
        if device == "cuda" and not torch.cuda.is_available():
            return "torch.cuda.is_available() is False"
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [B * next_n, max_model_len] float32, -inf past each row's limit."""
        return _module(OPS).fp8_paged_mqa_logits_torch(inputs.q, inputs.kv_cache, inputs.weights,
                                                       inputs.context_lens, inputs.block_table,
                                                       inputs.max_model_len)


class VllmTritonDecode:
    """`vllm-triton-decode`: rocm_fp8_paged_mqa_logits_triton, vLLM's Triton kernel for block-flat caches."""

    name = "vllm-triton-decode"

    @property
    def contract(self) -> Contract:
        return Contract(
            length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
            # It stores only positions p < len of each row into a workspace buffer nobody cleans.
            mask=MaskConvention.TAIL_UNSPECIFIED, fp8=_fp8_flavour(), output_dtype=torch.float32,
            # Not measured (never run yet): DeepGEMM's margin for an fp8 MMA with fp32 accumulation.
            rtol=1e-2, devices=("cuda",), block_sizes=(64, 128, 256), head_dims=(32, 64, 128, 256),
            # tl.arange(0, NUM_HEADS) and tl.arange(0, HEAD_SIZE) need powers of two; tl.dot(kv, q^T) on
            # NVIDIA needs N = heads >= 16 and, for fp8, K = head_dim >= 32.
            heads_power_of_two=True, heads_multiple_of=16,
            writes_into_output=True, library=_library("rocm_fp8_paged_mqa_logits_triton"))

    def unavailable_reason(self, device: str) -> str | None:
        for name in (OPS, WORKSPACE, TRITON_UTILS):
            _, why = load(name)
            if why:
                return why
        why = _cuda_reason(device, "vLLM's Triton decode kernel")
        if why:
            return why
        if not _module(TRITON_UTILS).HAS_TRITON:
            return "vllm.triton_utils.HAS_TRITON is False: vLLM replaced triton with its placeholder"
        if torch.version.hip is None and torch.cuda.get_device_capability() < (8, 9):
            return f"an fp8 tl.dot needs sm89 or newer, this GPU is {arch()}"
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [B * next_n, max_model_len] float32; the workspace view the kernel writes is first
        filled with the engine's poisoned `out`, so positions it never stores stay poison."""
        assert out is not None, "writes_into_output: the engine passes a poisoned buffer"
        workspace = _module(WORKSPACE)
        if not workspace.is_workspace_manager_initialized():
            workspace.init_workspace_manager(inputs.q.device)  # what GPUModelRunner.__init__ does
        rows = inputs.weights.shape[0]
        # The kernel's own get_simultaneous call of this shape returns this same view (offset 0).
        (buffer,) = workspace.current_workspace_manager().get_simultaneous(
            ((rows, inputs.max_model_len), torch.float32))
        buffer.copy_(out)
        logits = _module(OPS).rocm_fp8_paged_mqa_logits_triton(inputs.q, inputs.kv_cache, inputs.weights,
                                                               inputs.context_lens, inputs.block_table,
                                                               inputs.max_model_len)
        return logits.clone()  # the workspace is reused by the next call


def _deep_gemm_source() -> str:
    module, how = load_deep_gemm()
    return f"vllm.utils.deep_gemm over {how}" if module is not None else "vllm.utils.deep_gemm"


class VllmDeepGemm:
    """`vllm-deepgemm`: vLLM's DeepGEMM wrappers, native (B, next_n) path (sm90, next_n 1, 2, 4)."""

    name = "vllm-deepgemm"

    @property
    def contract(self) -> Contract:
        return Contract(
            length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
            mask=MaskConvention.TAIL_UNSPECIFIED, devices=("cuda",), archs=("sm90",),
            # vLLM's native_next_n_supported on sm90; it flattens other next_n (deepgemm-flattened).
            next_n=SM90_NATIVE_NEXT_N, head_dims=(32, 64, 128), block_sizes=(32, 64),
            output_dtype=torch.float32, rtol=1e-2,  # as `deepgemm`: the same kernel
            library=_library(_deep_gemm_source()))

    def unavailable_reason(self, device: str) -> str | None:
        for name in (DEEP_GEMM, PLATFORM_UTILS):
            _, why = load(name)
            if why:
                return why
        why = _cuda_reason(device, "DeepGEMM")
        if why:
            return why
        if arch() != "sm90":
            # sm100 decode goes through the varlen form (indices), which deepgemm-varlen covers.
            return f"vllm-deepgemm is vLLM's sm90 native path, this GPU is {arch()}"
        module, how = load_deep_gemm()  # the order vLLM's _import_deep_gemm tries: deep_gemm, then its copy
        if module is None:
            return f"DeepGEMM not importable ({how})"
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [B * next_n, max_model_len] float32 on sm90; the tail past each limit is not cleaned."""
        deep_gemm = _module(DEEP_GEMM)
        device = inputs.q.device.index if inputs.q.device.index is not None else torch.cuda.current_device()
        num_sms = _module(PLATFORM_UTILS).num_compute_units(device)  # what the metadata builder passes
        schedule = deep_gemm.get_paged_mqa_logits_metadata(inputs.context_lens, inputs.block_size, num_sms)
        q_scale, weights = deep_gemm.mqa_logits_mx_inputs(inputs.q, None, inputs.weights)
        return deep_gemm.fp8_fp4_paged_mqa_logits((inputs.q, q_scale), inputs.kv_cache, weights,
                                                  inputs.context_lens, inputs.block_table, schedule,
                                                  max_model_len=inputs.max_model_len, indices=None)
