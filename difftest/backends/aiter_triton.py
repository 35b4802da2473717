"""AITER's Triton paged MQA logits kernels (amd-aiter 0.1.7.x), launched the way their callers launch them.

Four backends (the VARIANTS table; one class), one per kernel in
aiter/ops/triton/_triton_kernels/pa_mqa_logits.py:

* `aiter-triton-stage1`: per-head scores into a [H, rows, max_model_len] float32 buffer that the
  caller pre-fills with -inf; the caller then sums over heads (vLLM's `rocm_fp8_paged_mqa_logits`,
  non-gfx94x branch: `out_qk.fill_(-inf)`, stage1, `out_qk.sum(dim=0)`).
* `aiter-triton-fused`: the head sum inside the kernel, into a [rows, max_model_len] buffer that
  AITER's own test pre-fills with -inf. (vLLM 0.33.0 calls a newer fused API, with Preshuffle and
  KVBlockSize, into an unfilled workspace buffer; this AITER's wrappers lack those arguments, so
  vLLM 0.33.0 takes its torch fallback with it, and its stage1 call needs a ChunkQ they lack too.)
* `aiter-triton-stage1-ragged`, `aiter-triton-fused-ragged`: the same with prefix sums of the
  sequence lengths and one flat list of token ids instead of a [B, W] token table.

All four read one length L per sequence and derive each draft row's window themselves; all take a
block-size-1 cache ([num_tokens, 1, 1, D + 4]: D fp8 key bytes, then one fp32 scale per token).
AITER's main branch changed the two non-ragged kernels (a paged cache, other tiles and split
counts): aiter_triton_paged launches those as their production caller does, chosen by the kernel's
parameters. Which aiter tree is used: the first on sys.path (docs/versions.md); the contract's
`library` names its version and kernel file.

The wrappers beside the kernels (aiter/ops/triton/pa_mqa_logits.py) import `aiter.dtypes`, which
needs ROCm, so this module loads the kernel file by path and launches the raw @triton.jit functions
with the wrappers' grids and config dicts. On the CPU the kernels run under the Triton interpreter:
a second copy of the file is loaded with TRITON_INTERPRET=1 set only while it is executed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from difftest.backends import aiter_library, aiter_triton_paged
from difftest.backends.aiter_library import DISTRIBUTION, aiter_dir
from difftest.backends.base import Backend
from difftest.core import hardware
from difftest.core.contract import Contract, Siblings, WorkingMemory, WorkPartition
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention, PartitionScope
from difftest.core.triton_interpret import interpreter_compat, load_kernel_module

# Where the kernels live inside the `aiter` package: 0.1.7.x first, then newer AITER's layout.
KERNEL_FILES = ("ops/triton/_triton_kernels/pa_mqa_logits.py",
                "ops/triton/_triton_kernels/attention/pa_mqa_logits.py")

# The wrappers' config dicts (aiter/ops/triton/pa_mqa_logits.py, amd-aiter 0.1.7.post2.dev18: the
# fused wrappers' defaults at lines 23-24, the stage1 wrappers' dicts at lines 85-88 and 137-140).
CHUNK_K = 64  # key positions per loop step; also the width of every (unmasked) store
SPLIT_KV = 5  # programs per query row, each taking a contiguous share of the chunks
STAGE1_CHUNK_Q = 32  # heads per stage1 program; the fused kernels take all heads at once
# Floats past the end of an output buffer that take a kernel's unbounded stores: one chunk, of
# either generation (aiter_triton_paged.CHUNK_K for the paged one).
GUARD = max(CHUNK_K, aiter_triton_paged.CHUNK_K)
HEAD_DIMS = (32, 64, 128, 256)  # tl.arange needs a power of two; an fp8 tl.dot on NVIDIA needs K >= 32

# Launch arguments of each kernel, in order, as amd-aiter 0.1.7.x declares them; a kernel file
# whose function takes other arguments is reported unavailable instead of being misfed.
_COMMON_ARGS = ("batch_size", "next_n", "heads_num", "Q_buffer", "stride_q_batch", "stride_q_next_n",
                "stride_q_heads", "KV_buffer", "stride_k_seq", "scale_buffer", "stride_scale_seq")
_CONFIG_ARGS = ("ChunkQ", "ChunkK", "HiddenDim", "SplitKV")


class OutOfBoundsWrite(UserWarning):
    """The kernel stored values past the end of the output buffer its caller allocated."""


@dataclasses.dataclass(frozen=True)
class KernelVariant:
    """One of the four kernels: its name in the file, what it reads and what it writes."""

    kernel: str
    ragged: bool  # prefix sums + flat token ids instead of lengths + a [B, W] token table
    per_head: bool  # stage1: [H, rows, max_model_len] per-head scores, summed by the caller
    slowdown: float  # the most it may take, as a multiple of its fastest sibling's time on a case (Siblings)

    @property
    def arg_names(self) -> tuple[str, ...]:
        lengths = ("prefix_sum_context_lens", "kv_indices") if self.ragged else ("context_len_ptr", "kv_indices")
        out = ("Out_buffer", "stride_out_heads") if self.per_head else ("OutLogits_buffer",)
        tail = ("stride_out_batch", "max_model_len") + (() if self.ragged else ("max_blk_len",))
        return _COMMON_ARGS + lengths + ("weights", "stride_w_batch") + out + tail + _CONFIG_ARGS


# --------------------------------------------------------------------------- locating and loading

aiter_version = aiter_library.aiter_version  # where the tests and the paged backends' callers have always found it


def kernel_file() -> Path | None:
    """The kernel file of the installed AITER, or None when aiter or the file is missing."""
    return aiter_library.kernel_file(KERNEL_FILES)


def load_kernels(interpret: bool) -> ModuleType:
    """The kernel file as a module: interpreted (CPU) or compiled (GPU); both may coexist."""
    path = kernel_file()
    if path is None:
        raise FileNotFoundError(f"no {' or '.join(KERNEL_FILES)} under the aiter package")
    return load_kernel_module(path, "difftest_aiter_pa_mqa_logits", interpret)


def _signature_reason(variant: KernelVariant) -> str | None:
    """Why the installed kernel file cannot be launched as this adapter launches it, or None."""
    try:
        module = load_kernels(interpret=True)
    except Exception as exc:  # a newer kernel file may import what this machine lacks
        return f"loading {kernel_file()} failed: {type(exc).__name__}: {exc}"
    fn = getattr(module, variant.kernel, None)
    if fn is None:
        return f"{kernel_file()} defines no {variant.kernel}"
    found = tuple(getattr(fn, "arg_names", ()))
    if found != variant.arg_names and found != aiter_triton_paged.ARG_NAMES.get(variant.kernel):
        return (f"{variant.kernel} in {kernel_file()} takes {found}, neither the amd-aiter 0.1.7 arguments "
                f"{variant.arg_names} nor the paged generation's this adapter passes")
    return None


def is_paged(variant: KernelVariant) -> bool:
    """Whether the kernel found is of AITER main's paged generation (aiter_triton_paged)."""
    path = kernel_file()
    return path is not None and aiter_triton_paged.is_paged(path, variant.kernel)


def _rocm_fnuz_reason() -> str | None:
    """gfx942 reads e4m3fnuz; this adapter hands the kernels e4m3fn (NVIDIA, gfx950, CPU)."""
    if hardware.is_rocm() and hardware.arch() == "gfx942":
        return "gfx942 reads fp8 as e4m3fnuz; use AITER's own wrappers there"
    return None


# --------------------------------------------------------------------------- launching

def _split_cache(kv_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 keys and fp32 scales as strided views of [N, 1, 1, D + 4] bytes, as the wrappers slice them."""
    keys = kv_cache[..., :head_dim].view(torch.float8_e4m3fn)
    scales = kv_cache[..., head_dim:].view(torch.float32)  # stride(0) = (D + 4) / 4 floats
    return keys, scales


def _guarded_full(shape: tuple[int, ...], device: torch.device,
                  fill: float | None = -math.inf) -> tuple[torch.Tensor, torch.Tensor]:
    """A buffer of `shape` as its caller allocates it, followed by GUARD NaN guard floats; filled
    with `fill`, or (None: an unfilled workspace) left to torch.empty, which the engine poisons.

    The kernels store whole chunks without a bound, so the last row's last chunk can
    land past the buffer's end. The guard takes those stores (instead of foreign memory: on the CPU
    interpreter that is this process's heap) and makes them countable. Shape, strides and
    contents of the buffer the kernel addresses are exactly the caller's.
    """
    numel = math.prod(shape)
    storage = torch.empty((numel + GUARD,), dtype=torch.float32, device=device)
    if fill is not None:
        storage[:numel] = fill
    storage[numel:] = math.nan
    return storage[:numel].view(shape), storage[numel:]


def _launch(variant: KernelVariant, inputs: KernelInputs, out: torch.Tensor) -> None:
    """One launch with the wrapper's grid and config; `out` is [H, rows, L] or [rows, L].

    Lengths and token ids go in as encoded: (B,) lengths and the [B, W] token table, or (B + 1,)
    prefix sums and the flat token ids for the ragged kernels.
    """
    interpret = inputs.q.device.type == "cpu"
    fn = getattr(load_kernels(interpret), variant.kernel)
    if is_paged(variant):
        aiter_triton_paged.launch(fn, variant.per_head, inputs, out)
        return
    q, weights = inputs.q, inputs.weights
    batch, next_n, heads, head_dim = q.shape
    keys, scales = _split_cache(inputs.kv_cache, head_dim)
    chunk_q = STAGE1_CHUNK_Q if variant.per_head else heads
    grid = (batch * next_n * (heads // chunk_q) * SPLIT_KV,)
    out_strides = (out.stride(0), out.stride(1)) if variant.per_head else (out.stride(0),)
    table_width = () if variant.ragged else (inputs.block_table.shape[1],)
    with interpreter_compat() if interpret else contextlib.nullcontext():
        fn[grid](batch, next_n, heads, q, q.stride(0), q.stride(1), q.stride(2),
                 keys, keys.stride(0), scales, scales.stride(0), inputs.context_lens, inputs.block_table,
                 weights, weights.stride(0), out, *out_strides, inputs.max_model_len, *table_width,
                 ChunkQ=chunk_q, ChunkK=CHUNK_K, HiddenDim=head_dim, SplitKV=SPLIT_KV)


# --------------------------------------------------------------------------- the backends

# The four kernels compute the same logits: `--time` compares them case by case (Siblings), and
# AITER's own wrappers (aiter_rocm) join the same group. Allowed slowdowns, not yet measured: the
# fused kernels, 1.5 (ragged or not, the same work). Stage1 moves H times the logits three times
# (the caller's -inf fill, the per-head stores, the head sum): at H = 64, B = 40, next_n = 2 and 120K
# that is 7.4 GB against the fused kernels' 0.6 GB of keys, about 12x on bandwidth alone; 16 takes it.
SIBLINGS = "aiter-paged-mqa-logits"
FUSED_SLOWDOWN = 1.5
STAGE1_SLOWDOWN = 16.0

VARIANTS: dict[str, KernelVariant] = {
    "aiter-triton-stage1": KernelVariant("_deepgemm_fp8_paged_mqa_logits_stage1", ragged=False, per_head=True,
                                         slowdown=STAGE1_SLOWDOWN),
    "aiter-triton-fused": KernelVariant("_deepgemm_fp8_paged_mqa_logits", ragged=False, per_head=False,
                                        slowdown=FUSED_SLOWDOWN),
    "aiter-triton-stage1-ragged": KernelVariant("_deepgemm_fp8_paged_mqa_logits_stage1_ragged_k",
                                                ragged=True, per_head=True, slowdown=STAGE1_SLOWDOWN),
    "aiter-triton-fused-ragged": KernelVariant("_deepgemm_fp8_paged_mqa_logits_ragged_k", ragged=True, per_head=False,
                                               slowdown=FUSED_SLOWDOWN),
}

# Each row's CHUNK_K-token chunks are cut among its own SPLIT_KV programs, cdiv(cdiv(L, ChunkK),
# SplitKV) contiguous chunks each (_triton_kernels/pa_mqa_logits.py:51-57, the stage1 ragged kernel;
# the same lines in the other three).
PARTITION = WorkPartition(CHUNK_K, PartitionScope.PER_ROW, workers=SPLIT_KV)
# Stage1's working memory: the per-head scores, [H, rows, max_model_len] float32, held besides the
# [rows, max_model_len] head sum returned. AITER's stage1 wrappers allocate nothing: they take that buffer
# from their caller as `out_qk` (0.1.7.post2.dev18: aiter/ops/triton/pa_mqa_logits.py:66-70 and 117-121;
# main: aiter/ops/triton/attention/pa_mqa_logits.py:134-138 and 185-189). Their caller, vLLM's
# rocm_fp8_paged_mqa_logits, takes it from its workspace (0.33.0: rocm_aiter_mla_sparse.py:845-848,
# `get_simultaneous(((heads, batch_size * next_n, max_model_len), torch.float32))`, filled with -inf,
# then `out_qk.sum(dim=0)`), and so do this backend's `_caller` (_guarded_full: GUARD floats past it)
# and aiter_rocm's call. 4 bytes per head per logit: 512 GiB at H = 64 for 2^31 logits, which the
# planner must leave out on any GPU. The fused kernels write the returned buffer itself: nothing more.
STAGE1_WORKING_MEMORY = WorkingMemory(bytes_per_logit_per_head=4)
# Key rows are addressed as `KV_buffer + token_id * stride_k_seq` (_triton_kernels/pa_mqa_logits.py:
# 84-85, 179-180, 273-274, 367-368): an int32 token id times an int32 stride, so a byte offset past
# 2**31 overflows. Measured on the H200 (Triton 3.6, stage1 and fused-ragged, 2026-12-02): keys in the
# last slots of a 2147483580-byte cache read right; 64 slots more is an illegal memory access. That
# is a bug (production caches are larger), not an envelope limit: no max_pool_bytes is declared, so
# the pool families reach it (docs/findings/aiter-triton-int32-offsets.md).


def kernel_contract(variant: KernelVariant) -> Contract:
    """What one of the four kernels takes and promises, however it is launched (here or through
    AITER's own wrappers, difftest.backends.aiter_rocm). The paged generation's differences
    (aiter_triton_paged) replace the 0.1.7.x facts where the kernel found is of it."""
    contract = Contract(
        length_encoding=LengthEncoding.PREFIX_SUM if variant.ragged else LengthEncoding.PER_SEQUENCE,
        # With block size 1 the two layouts coincide; the kernels slice each token's row into D
        # key bytes and its 4 scale bytes, i.e. token-interleaved.
        cache_layout=CacheLayout.TOKEN_INTERLEAVED,
        # Every caller pre-fills the output with -inf, and the kernels are meant to store -inf past
        # each row's window (they do not always: docs/findings/aiter-triton-mask.md).
        mask=MaskConvention.TAIL_NEG_INF,
        fp8=Fp8Flavour.E4M3FN,
        output_dtype=torch.float32,
        # tl.dot of fp8 accumulates in fp32: on the interpreter a float32 numpy matmul (2e-7 of the
        # row's largest logit measured); on the H200 the fused kernels' 64-head fp8 MMA reached
        # 3.4e-4 and stage1 2e-7 (2026-12-02). 1e-3 leaves three times that margin.
        rtol=1e-3,
        devices=("cpu", "cuda"),
        block_sizes=(1,),
        head_dims=HEAD_DIMS,
        heads_multiple_of=STAGE1_CHUNK_Q if variant.per_head else 1,
        heads_power_of_two=not variant.per_head,  # the fused kernels take all heads as one tl.arange block
        # next_n, heads and max_context: any (runtime arguments with no bound in the kernels). The
        # output offsets are int32 too (`row * stride_out_batch + p`, plus `head * stride_out_heads`
        # in stage1), which bounds rows * max_model_len (times H in stage1), not max_context alone.
        tiles=(CHUNK_K,),
        partition=PARTITION,
        writes_into_output=False,
        working_memory=STAGE1_WORKING_MEMORY if variant.per_head else WorkingMemory(),
        library=aiter_library.library(kernel_file()),
        siblings=Siblings(SIBLINGS, variant.slowdown))
    return dataclasses.replace(contract, **aiter_triton_paged.contract_changes(variant.per_head)) \
        if is_paged(variant) else contract


class AiterTriton:
    """One of the four kernels (VARIANTS[name]), launched with its wrapper's grid and config."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.variant = VARIANTS[name]
        self.contract = kernel_contract(self.variant)
        self.last_out_of_bounds = 0  # floats the last call stored past its buffer's end

    def unavailable_reason(self, device: str) -> str | None:
        """Why this kernel cannot run on `device`, most basic cause first; None when it can."""
        if device not in ("cpu", "cuda"):
            return f"device {device!r} is neither 'cpu' (Triton interpreter) nor 'cuda'"
        if importlib.util.find_spec("aiter") is None:
            return f"{DISTRIBUTION} is not installed (importlib.util.find_spec('aiter') is None)"
        try:
            importlib.import_module("triton")
        except Exception as exc:
            return f"triton is not importable: {type(exc).__name__}: {exc}"
        if kernel_file() is None:
            return f"neither {' nor '.join(KERNEL_FILES)} exists under {aiter_dir()}"
        if device == "cuda":
            reason = self._cuda_reason()
            if reason:
                return reason
        return _signature_reason(self.variant)

    def _cuda_reason(self) -> str | None:
        reason = hardware.cuda_unavailable_reason()
        if reason:
            return reason
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            return "TRITON_INTERPRET is set in the environment, so Triton compiles nothing for the GPU"
        return _rocm_fnuz_reason()

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [rows, max_model_len] float32; `out` is unused (the backend allocates its caller's buffer)."""
        logits, guard, shape = self._caller(inputs)
        self._check_guard(guard, shape, inputs.max_model_len)
        return logits

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """Nothing is built once per batch: each call fills its caller's -inf buffer, launches and
        (stage1) sums over heads, as vLLM's per-layer call does (Preparable). The guard check, which
        reads a count back to the host, is difftest's own and stays out."""
        return lambda: self._caller(inputs)[0]

    def _caller(self, inputs: KernelInputs) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
        """What the kernel's caller does: (the logits, the guard past its buffer, the buffer's shape)."""
        batch, next_n, heads, _ = inputs.q.shape
        rows = batch * next_n
        shape = (heads, rows, inputs.max_model_len) if self.variant.per_head else (rows, inputs.max_model_len)
        # vLLM's fused call into AITER's paged generation hands it an unfilled workspace.
        unfilled = not self.variant.per_head and is_paged(self.variant)
        buffer, guard = _guarded_full(shape, inputs.q.device, None if unfilled else -math.inf)
        _launch(self.variant, inputs, buffer)
        return buffer.sum(dim=0) if self.variant.per_head else buffer, guard, shape

    def _check_guard(self, guard: torch.Tensor, shape: tuple[int, ...], max_model_len: int) -> None:
        self.last_out_of_bounds = int((~torch.isnan(guard)).sum())
        if self.last_out_of_bounds:
            warnings.warn(
                f"{self.name} stored {self.last_out_of_bounds} float32 values past the end of its "
                f"{list(shape)} output: the last row's final {CHUNK_K}-position chunk is stored "
                f"without a bound and max_model_len={max_model_len} is not a multiple of {CHUNK_K}",
                OutOfBoundsWrite, stacklevel=2)


BACKENDS: dict[str, Callable[[], Backend]] = {name: functools.partial(AiterTriton, name) for name in VARIANTS}
