"""DeepGEMM's paged MQA logits, called as vLLM 0.33's indexer calls it (docs/reference/kernel.md).

    meta = get_paged_mqa_logits_metadata(context_lens, block_size, num_sms[, indices=indices])
    logits = fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens, block_table,
                                      meta, max_model_len[, logits_dtype=...][, indices=indices])

`indices` and `logits_dtype` go by keyword, as vLLM's wrappers pass them (vllm/utils/deep_gemm.py,
0.33.0 :707-799, 0.34.0 :776-870): the two vendored builds differ in where they take them (0.33.0's
_C.py:187-188 `(..., max_context_len, indices=None)`, 0.34.0's :189-190 `(..., max_context_len,
logits_dtype=torch.float32, indices=None)`), so a positional `indices` would be 0.34.0's logits_dtype.
DeepGEMM returns its logits as the view `[:, :max_context_len]` of rows padded to a multiple of the
split size and of 1024 bytes (the host's `aligned_max_context_len`); vLLM hands that view to its top-k
with its row stride, and so does this backend: difftest reads the view through its strides.

Variants of one backend (the VARIANTS table), so they can be compared with each other as well as with
the oracle:
* deepgemm           native MTP: (B, next_n) lengths; sm90 takes next_n in {1, 2, 4}, and at
                     next_n = 4 the schedule is built for num_sms // 2 slots.
* deepgemm-flattened every draft row as its own request of next_n = 1, (T, 1) lengths and the
                     block-table rows repeated: what vLLM does for next_n the kernel cannot take.
* deepgemm-varlen    flattened rows plus `indices` (request id per row); sm100 only.
* deepgemm-bf16-logits  native MTP with `logits_dtype=torch.bfloat16`: vLLM 0.34's indexer with
                     `indexer_logits_dtype = "bfloat16"` on sm90 (vllm/config/attention.py:135, resolved at
                     model_executor/layers/sparse_attn_indexer.py:1323-1325; fp32 weights, which the host
                     allows with bf16 logits). DeepGEMM trees whose entry point takes no logits_dtype
                     (vllm 0.33.0's) make it unavailable.

The envelope facts are those of the pinned DeepGEMM 2.8.1, vLLM 0.33.0's vendored copy
(as scripts/prepare_device.sh carries it to the GPU machine). Its host code is
compiled into `_C_extension.abi3.so`: "host assert" below cites an assertion string `strings` finds
there; "impl"/"sched" cite include/deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh and
include/deep_gemm/scheduler/sm90_paged_mqa_logits.cuh in the tarball.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from types import ModuleType

import torch

from difftest.backends import deep_gemm_library
from difftest.backends.base import Backend
from difftest.core import hardware
from difftest.core.contract import Contract, Siblings, WorkPartition
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention, PartitionScope

# FP8 MMA accumulates with ~14 bits (and bf16 output on sm100): on the H200 the largest error of a
# correct result was 3.0e-3 of the row's largest logit (on the H200), a row with another
# request's q was off by 0.5 or more (13-zero-length-straddle).
RTOL = 1e-2

# --------------------------------------------------------------------------- sm90 facts
# host assert "next_n == 1 or next_n == 2 or next_n == 4" (the sm90 kernel's launcher)
SM90_NATIVE_NEXT_N = (1, 2, 4)
# host assert "(not is_fp4 and head_dim == 32) or head_dim == 64 or head_dim == 128" (fp8 q)
HEAD_DIMS = (32, 64, 128)
# host assert "... (arch_major == 9 and (block_kv == 32 or block_kv == 64)) ..." (kv cache shape)
SM90_BLOCK_SIZES = (32, 64)
# host assert "num_heads == 32 or num_heads == 64" (csrc/apis/attention.hpp:303, the sm90 branch of
# fp8_fp4_paged_mqa_logits). Measured on the H200 (2.8.1, 2026-12-02): heads 8, 16, 24, 48, 128 raise
# that assertion, 32 and 64 run; head_dim 256 and next_n 3 raise theirs.
SM90_HEADS = (32, 64)
# impl:52 kComputeBlockKV = 64: keys per MMA tile and per schedule block (sched counts num_kv in 64s).
SM90_COMPUTE_BLOCK_KV = 64
# impl:57 SPLIT_KV == kComputeBlockKV * kNumMathWarpGroups; the host picks 256 on sm90 (4 math
# warpgroups). Measured: [33537, 0, 1] = 132 + 0 + 1 splits of 256 on the H200's 132 SMs
# (docs/findings/deepgemm-zero-length-request.md).
SM90_SPLIT_KV = 256
# Measured, not a library limit (the kernel's offsets are 64-bit, impl:283 and :354): on the H200,
# max_model_len 131072 with B = 64, next_n = 2 (docs/findings/deepgemm-zero-length-request.md), and
# 131072, 163840, 262144 and 524288 with B = 1, H = 64, D = 128, each within 2.5e-4 of the oracle
# (2.8.1, 2026-12-02). 262144 keeps a factor of two below the longest seen to work and covers
# DeepSeek-V3.2's 163840.
MAX_CONTEXT = 262144
# scheduler/sm90_paged_mqa_logits.cuh:21-22: the metadata kernel keeps one uint32 per request (the batch
# rounded up to 32, kAlignedBatchSize) in shared memory, which holds 232448 bytes on an sm90 SM: 58112
# requests at most. On the H200 (2.8.1, 2026-12-04) B = 65537 raised the host's assertion "smem_size <=
# SM90ArchSpec::smem_capacity" in get_paged_mqa_logits_metadata. A flattened call hands B * next_n requests.
SM90_MAX_BATCH = 232448 // 4
# sched:77-80: ceil(L / SPLIT_KV) units per request laid end to end and cut into contiguous ranges,
# one per SM; at next_n = 4 one schedule entry drives a two-CTA cluster (host assert
# "_schedule_meta_size == num_sms / num_kv_multicast + 1"), so half the SMs take ranges.
SM90_PARTITION = WorkPartition(SM90_SPLIT_KV, PartitionScope.GLOBAL, workers=None, halved_at_next_n=(4,))
SM90_FLAT_PARTITION = dataclasses.replace(SM90_PARTITION, halved_at_next_n=())  # the kernel sees next_n = 1

# The three variants compute the same logits: `--time` compares them case by case (Siblings).
SIBLINGS = "deepgemm-paged-mqa-logits"

# --------------------------------------------------------------------------- sm100 facts
# host assert "arch_major == 12 or is_varlen == (arch_major == 10)": sm100 takes only varlen calls
# (indices given), sm90 only calls without them.
# host assert "is_varlen and next_n == 1 and (block_kv == 32 or block_kv == 64 or block_kv == 128)"
SM100_BLOCK_SIZES = (32, 64, 128)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of calling the library: how lengths reach it, on which GPUs, with which extras."""

    encoding: LengthEncoding
    archs: tuple[str, ...]
    flattened: bool  # (T, 1) lengths: every query row a request of next_n = 1
    indices: bool  # passes the request id of each row (`indices`): the varlen form
    slowdown: float  # the most it may take, as a multiple of its fastest sibling's time on a case (Siblings)
    logits_dtype: torch.dtype | None = None  # passed as `logits_dtype=`; None: not passed (the entry point's float32)

    def contract(self, library: str) -> Contract:
        """The whole envelope of this variant on the archs it runs on."""
        siblings = Siblings(SIBLINGS, self.slowdown)
        if self.indices:
            return _sm100_varlen_contract(self.encoding, self.archs, library, siblings)
        return Contract(
            length_encoding=self.encoding, cache_layout=CacheLayout.BLOCK_SPLIT,
            mask=MaskConvention.TAIL_UNSPECIFIED, devices=("cuda",), archs=self.archs,
            # Flattened rows reach the kernel at next_n = 1 whatever the case's next_n is.
            next_n=None if self.flattened else SM90_NATIVE_NEXT_N,
            head_dims=HEAD_DIMS, block_sizes=SM90_BLOCK_SIZES, heads=SM90_HEADS, max_context=MAX_CONTEXT,
            max_batch=SM90_MAX_BATCH, tiles=(SM90_COMPUTE_BLOCK_KV, SM90_SPLIT_KV),
            partition=SM90_FLAT_PARTITION if self.flattened else SM90_PARTITION,
            output_dtype=self.logits_dtype or torch.float32, rtol=RTOL, library=library, siblings=siblings,
            batchable=True)


def _sm100_varlen_contract(encoding: LengthEncoding, archs: tuple[str, ...], library: str,
                           siblings: Siblings) -> Contract:
    """sm100's varlen path, never run here. Its split size (kMQALogitsSplitKV) is compiled into the
    binary, its scheduler weighs each request's splits by a cost (scheduler/sm100_paged_mqa_logits.cuh:120)
    rather than cutting even contiguous ranges, and which head counts it takes could not be pinned to
    this path: heads, tiles and partition stay unknown (None, (), None)."""
    return Contract(
        length_encoding=encoding, cache_layout=CacheLayout.BLOCK_SPLIT, mask=MaskConvention.TAIL_UNSPECIFIED,
        devices=("cuda",), archs=archs, next_n=None, head_dims=HEAD_DIMS,
        block_sizes=SM100_BLOCK_SIZES, max_context=MAX_CONTEXT,  # as sm90's: measured there only
        output_dtype=torch.bfloat16,  # the source's `out_dtype = arch_major == 10 ? BFloat16 : Float`
        rtol=RTOL, library=library, siblings=siblings,
        batchable=True)


# Allowed slowdowns. Native MTP is the path vLLM prefers, so it should be the fastest: 1.25 leaves
# room for noise only. Flattened rows measured 1.75x native on the H200 at B = 40, next_n = 2, 120K
# (the README's backends table): 2.0 takes that cost, not a 4x one (vLLM's varlen path before its
# fix: 214 us against 52 us). Varlen runs on sm100 only, where it has no running sibling yet.
VARIANTS: dict[str, Variant] = {
    "deepgemm": Variant(LengthEncoding.PER_ROW, ("sm90",), flattened=False, indices=False, slowdown=1.25),
    "deepgemm-flattened": Variant(LengthEncoding.FLATTENED, ("sm90",), flattened=True, indices=False, slowdown=2.0),
    "deepgemm-varlen": Variant(LengthEncoding.FLATTENED_INDICES, ("sm100", "sm103"), flattened=True, indices=True,
                               slowdown=2.0),
    # The same kernel storing bf16 (impl's logits_dtype_t): it writes half the bytes, so no slower than native.
    "deepgemm-bf16-logits": Variant(LengthEncoding.PER_ROW, ("sm90",), flattened=False, indices=False, slowdown=1.25,
                                    logits_dtype=torch.bfloat16),
}


# --------------------------------------------------------------------------- the library

# 2.x renamed fp8_paged_mqa_logits when FP4 keys arrived; older installs only have the old name.
ENTRY_POINTS = ("fp8_fp4_paged_mqa_logits", "fp8_paged_mqa_logits")


describe = deep_gemm_library.describe  # where the paged backend's callers have always found it


def load_deep_gemm() -> tuple[ModuleType | None, str]:
    """(the module, how it was found) or (None, why not), trying the standalone then vLLM's copy."""
    return deep_gemm_library.find(ENTRY_POINTS)


def library_name() -> str:
    """The DeepGEMM found, for the contract's `library`."""
    return deep_gemm_library.library_name(ENTRY_POINTS)


def loaded_module() -> ModuleType:
    """The DeepGEMM found (load_deep_gemm); RuntimeError saying why when none is."""
    return deep_gemm_library.loaded(ENTRY_POINTS)


def _logits_fn(module: ModuleType) -> Callable[..., torch.Tensor]:
    return getattr(module, "fp8_fp4_paged_mqa_logits", None) or module.fp8_paged_mqa_logits


# --------------------------------------------------------------------------- the backend

class DeepGemm:
    """One DeepGEMM variant (VARIANTS[name]): metadata, then the logits kernel, as vLLM calls them."""

    # vLLM's indexer metadata builder recomputes the schedule at every step, captured graph or not
    # (base.rebuilt_every_step): a graph replay must not reuse the capture's.
    rebuilt_every_step = "vLLM's indexer metadata builder (get_paged_mqa_logits_metadata, every step)"

    def __init__(self, name: str) -> None:
        self.name = name
        self.variant = VARIANTS[name]

    @property
    def contract(self) -> Contract:
        """The variant's envelope; `library` names the DeepGEMM found (importing it once)."""
        return self.variant.contract(library_name())

    def unavailable_reason(self, device: str) -> str | None:
        """Why this variant cannot run on `device`, most basic cause first; None when it can."""
        if device != "cuda":
            return f"DeepGEMM runs on CUDA GPUs only (device {device})"
        reason = hardware.cuda_unavailable_reason()
        if reason:
            return reason
        module, how = load_deep_gemm()
        if module is None:
            return f"DeepGEMM not importable ({how})"
        if hardware.arch() not in self.variant.archs:
            return f"{self.name} needs {'/'.join(self.variant.archs)}, this GPU is {hardware.arch()}"
        return self.signature_reason(module)

    def signature_reason(self, module: ModuleType) -> str | None:
        """Why the entry point found cannot take this variant's keywords, or None."""
        wanted = [*self.dtype_keyword(), *(["indices"] if self.variant.indices else [])]
        try:
            taken = inspect.signature(_logits_fn(module)).parameters
        except (TypeError, ValueError):  # a builtin without a signature: let the call say
            return None
        missing = [name for name in wanted if name not in taken]
        return f"{_logits_fn(module).__qualname__} of {library_name()} takes no {', '.join(missing)}" if missing \
            else None

    def num_sms(self, module: ModuleType, next_n: int) -> int:
        """Schedule slots: the SM count, halved where the partition says (sm90 next_n = 4)."""
        sms = module.get_num_sms()
        partition = self.contract.partition
        return sms if partition is None else partition.worker_count(next_n, sms)

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [rows, max_model_len]; the tail past each row's limit is not cleaned."""
        return self.launch(inputs, self.schedule(inputs))

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The schedule built now, once, as vLLM builds it once per step; what is returned launches
        the logits kernel alone, as each layer's indexer does (Preparable)."""
        return functools.partial(self.launch, inputs, self.schedule(inputs))

    def schedule(self, inputs: KernelInputs) -> torch.Tensor:
        """The schedule metadata vLLM builds once per step from the step's lengths."""
        module = loaded_module()
        slots = self.num_sms(module, inputs.q.shape[1])
        return module.get_paged_mqa_logits_metadata(self.context_lens(inputs), inputs.block_size, slots,
                                                    **self.indices_keyword(inputs))

    def launch(self, inputs: KernelInputs, schedule: torch.Tensor) -> torch.Tensor:
        """The logits kernel alone, on a schedule from `schedule()`."""
        return _logits_fn(loaded_module())((inputs.q, None), inputs.kv_cache, inputs.weights,
                                           self.context_lens(inputs), inputs.block_table, schedule,
                                           inputs.max_model_len, **self.dtype_keyword(),
                                           **self.indices_keyword(inputs))

    def context_lens(self, inputs: KernelInputs) -> torch.Tensor:
        """The lengths as the variant passes them; DeepGEMM 2.x requires 2-D ones even at next_n = 1,
        so flattened rows go in as (T, 1), as vLLM passes them."""
        return inputs.context_lens.reshape(-1, 1) if self.variant.flattened else inputs.context_lens

    def dtype_keyword(self) -> dict[str, torch.dtype]:
        """`logits_dtype=` where the variant sets one (vLLM 0.34 passes it by keyword); nothing otherwise."""
        return {} if self.variant.logits_dtype is None else {"logits_dtype": self.variant.logits_dtype}

    def indices_keyword(self, inputs: KernelInputs) -> dict[str, torch.Tensor]:
        """`indices=` (the request id of each row) of the varlen form, by keyword as vLLM passes it to both
        calls; nothing otherwise."""
        if not self.variant.indices:
            return {}
        assert inputs.indices is not None, "a FLATTENED_INDICES encoding carries indices"
        return {"indices": inputs.indices}


BACKENDS: dict[str, Callable[[], Backend]] = {name: functools.partial(DeepGemm, name) for name in VARIANTS}
# The names scripts/ and bench/ construct directly.
DeepGemmNative = BACKENDS["deepgemm"]
DeepGemmFlattened = BACKENDS["deepgemm-flattened"]
DeepGemmVarlen = BACKENDS["deepgemm-varlen"]
