"""AITER's Triton ragged (prefill) MQA logits kernel, launched as its wrapper launches it.

amd-aiter 0.1.7.post2.dev18 (difftest's pinned AITER): `fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts,
cu_ends)` in aiter/ops/triton/fp8_mqa_logits.py:8-74 asserts H and D powers of two (:31-33), allocates logits
[M, N] float32 filled with -inf ("must be initialized to -inf, because of causal masking", :26, :35-40) and
launches `_fp8_mqa_logits_kernel` (aiter/ops/triton/_triton_kernels/fp8_mqa_logits.py) on grid (M,): one program
per row, BLOCK_KV 128, num_warps 4, num_stages 2 (:47-73; its waves_per_eu and matrix_instr_nonkdim are AMD
compile options, left out on NVIDIA and under the interpreter). The scale is applied before the ReLU, as in
vLLM's reference. AITER main moved both files under attention/ with the same kernel arguments; vLLM 0.33's ROCm
prefill (rocm_fp8_mqa_logits, rocm_aiter_mla_sparse.py:941-982) calls a newer wrapper with `clean_logits=False`,
which this AITER's lacks.

Importing the wrapper runs aiter/__init__.py, which needs ROCm, so the kernel file is loaded by path and the raw
jit function launched with the wrapper's grid and arguments (as difftest.backends.aiter_triton does for the paged
kernels). Which aiter tree: the first on sys.path (difftest.backends.aiter_library).

Guards. In 0.1.7.post2.dev18 a window's tiles start at k_start but the last whole tile is counted from key 0
(_triton_kernels/fp8_mqa_logits.py:62-99), so where k_start is no multiple of 128 a tile reads up to 127 keys
past the window (past the buffer near its end) and stores past the row (docs/findings/aiter-triton-ragged-window.md).
The kernel is handed the key buffer and its scales each followed by GUARD rows of NaN, and the output by GUARD
floats of the poison, in the same allocations: the tensors it sees have the wrapper's shapes and strides, reads
past them find NaN instead of foreign memory, and stores past the output are counted (last_out_of_bounds).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path

import torch

from difftest.backends import aiter_library
from difftest.backends.ragged_base import RaggedBackend
from difftest.core import hardware
from difftest.core.kinds import LogitsForm, MaskConvention
from difftest.core.poison import is_poison, poisoned
from difftest.core.ragged import RaggedContract, RaggedInputs, RaggedTiles
from difftest.core.triton_interpret import interpreter_compat, load_kernel_module

KERNEL_FILES = ("ops/triton/_triton_kernels/fp8_mqa_logits.py",
                "ops/triton/_triton_kernels/attention/fp8_mqa_logits.py")
KERNEL = "_fp8_mqa_logits_kernel"
BLOCK_KV = 128  # the wrapper's (fp8_mqa_logits.py:29)
GUARD = BLOCK_KV  # rows of NaN after each buffer: the most one tile can pass its end by
# tl.dot(q [H, D], keys [D, BLOCK_KV]) of fp8: on NVIDIA an fp8 MMA needs H >= 16 and K = D >= 32; H and D powers of
# two (the wrapper's asserts).
HEADS = (16, 32, 64, 128)
HEAD_DIMS = (32, 64, 128, 256)
# fp8 tl.dot accumulating in fp32: AITER's paged fused kernel, the same 64-head fp8 dot, reached 3.4e-4 of the row's
# largest logit on the H200 (difftest.backends.aiter_triton); the interpreter computes it as a float32 matmul.
RTOL = 1e-3


def kernel_file() -> Path | None:
    """The kernel file of the aiter tree found, or None."""
    return aiter_library.kernel_file(KERNEL_FILES)


def contract() -> RaggedContract:
    """ABSOLUTE logits the wrapper pre-fills with -inf: every key outside a window is promised -inf."""
    return RaggedContract(form=LogitsForm.ABSOLUTE, mask=MaskConvention.TAIL_NEG_INF, heads=HEADS, head_dims=HEAD_DIMS,
                          powers_of_two=True, tiles=RaggedTiles(kv=(BLOCK_KV,), q_rows=1), rtol=RTOL,
                          library=aiter_library.library(kernel_file()))


class AiterRagged:
    """`_fp8_mqa_logits_kernel`, launched as `fp8_mqa_logits` launches it."""

    name = "aiter-triton-ragged"

    def __init__(self) -> None:
        self.contract = contract()
        self.last_out_of_bounds = 0  # logits the last call stored past its output

    def unavailable_reason(self, device: str) -> str | None:
        """Why the kernel cannot run on `device`, most basic cause first; None when it can."""
        if importlib.util.find_spec("aiter") is None:
            return f"{aiter_library.DISTRIBUTION} is not installed (importlib.util.find_spec('aiter') is None)"
        if kernel_file() is None:
            return f"neither {' nor '.join(KERNEL_FILES)} exists under {aiter_library.aiter_dir()}"
        if device == "cuda":
            reason = hardware.cuda_unavailable_reason()
            if reason:
                return reason
            if hardware.is_rocm() and hardware.arch() == "gfx942":
                return "gfx942 reads fp8 as e4m3fnuz; use AITER's own wrapper there"
        try:
            getattr(_kernels(device == "cpu"), KERNEL)
        except Exception as exc:  # a newer kernel file may import what this machine lacks
            return f"loading {KERNEL} from {kernel_file()} failed: {type(exc).__name__}: {exc}"
        return None

    def __call__(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [rows, keys] float32, -inf where the kernel stores nothing."""
        logits, guard = self._caller(inputs)()
        self.last_out_of_bounds = int((~is_poison(guard)).sum())
        return logits

    def prepare(self, inputs: RaggedInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """What the wrapper does each call (the -inf buffer, the launch); the guarded inputs made once, now."""
        call = self._caller(inputs)
        return lambda: call()[0]

    def _caller(self, inputs: RaggedInputs) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """A call returning (the logits, the guard floats past them)."""
        q, weights = inputs.q, inputs.weights
        rows, heads, dim = q.shape
        keys, scales = _guarded(inputs.k, inputs.fp8.nan_byte), _guarded(inputs.k_scale, math.nan)
        interpret = q.device.type == "cpu"
        kernel = getattr(_kernels(interpret), KERNEL)

        def call() -> tuple[torch.Tensor, torch.Tensor]:
            storage = poisoned((rows * inputs.keys + GUARD,), torch.float32, q.device)
            storage[:rows * inputs.keys] = -math.inf
            logits = storage[:rows * inputs.keys].view(rows, inputs.keys)
            with interpreter_compat() if interpret else contextlib.nullcontext():
                kernel[(rows,)](q, keys, scales, weights, inputs.k_start, inputs.k_end, logits, rows, inputs.keys,
                                NUM_HEADS=heads, HEAD_SIZE=dim, stride_q_s=q.stride(0), stride_q_h=q.stride(1),
                                stride_q_d=q.stride(2), stride_kv_s=keys.stride(0), stride_kv_d=keys.stride(1),
                                stride_w_s=weights.stride(0), stride_w_h=weights.stride(1),
                                stride_logits_s=logits.stride(0), stride_logits_k=logits.stride(1),
                                BLOCK_KV=BLOCK_KV, num_warps=4, num_stages=2)
            return logits, storage[rows * inputs.keys:]

        return call


def _kernels(interpret: bool) -> object:
    path = kernel_file()
    if path is None:
        raise FileNotFoundError(f"no {' or '.join(KERNEL_FILES)} under the aiter package")
    return load_kernel_module(path, "difftest_aiter_fp8_mqa_logits", interpret)


def _guarded(tensor: torch.Tensor, fill: float) -> torch.Tensor:
    """A copy of `tensor` (its first dimension the rows) followed, in the same allocation, by GUARD rows of
    `fill` (an fp8 tensor's: a NaN byte): the same shape and strides, nothing foreign past its end."""
    raw = tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor
    storage = torch.empty((tensor.shape[0] + GUARD, *tensor.shape[1:]), dtype=raw.dtype, device=tensor.device)
    storage[:tensor.shape[0]] = raw
    storage[tensor.shape[0]:] = fill
    return storage[:tensor.shape[0]].view(tensor.dtype)


RAGGED_BACKENDS: dict[str, Callable[[], RaggedBackend]] = {"aiter-triton-ragged": AiterRagged}
