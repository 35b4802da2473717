"""vLLM 0.33.0's compiled DSA top-k kernels (`torch.ops._C` in `vllm/_C_stable_libtorch.abi3.so`), called
as vLLM's indexer calls them.

Schemas (strings of the .so; vllm/_custom_ops.py:3203-3245 wraps the first two):
  top_k_per_row_prefill(logits, rowStarts, rowEnds, indices!, numRows, stride0, stride1, topK)
  top_k_per_row_decode(logits, next_n, seq_lens, indices!, numRows, stride0, stride1, topK)
  persistent_topk(logits, lengths, output!, workspace, k, max_seq_len)
  cooperative_topk(logits, lengths, output!, workspace, k, max_seq_len)

The caller pre-fills the indices with -1 (`topk_indices_buffer[:n] = -1`,
vllm/model_executor/layers/sparse_attn_indexer.py:604) and hands the two radix kernels a 1 MiB uint8
workspace (`RADIX_TOPK_WORKSPACE_SIZE`, vllm/model_executor/layers/indexer_topk.py:16) and the largest row
length as `max_seq_len` (:328-333). Every kernel returns indices relative to the window's start, -1 past the
window length (a window of at most k returns all its positions, -inf ones included), in no promised order.
Facts per kernel (csrc/libtorch_stable/sampler.cu and persistent_topk.cuh as stored upstream, cross-checked
against the binary's kernel stubs): any k for the per-row kernels (512/1024/2048 used), k in {512, 1024,
2048} for the radix ones ("persistent_topk supports k=512, k=1024, or k=2048"); cooperative_topk takes at
most 64 rows and a row stride divisible by 4 (indexer_topk.py:21, 270-273), sm90+ but not sm12x. NaN is
undefined: vllm#49896 (NaN logits leave slots unwritten).

The .so is built on torch's stable ABI; every torch symbol it needs is exported by torch 2.11 (checked with
nm against the 2.11.0 wheel), so torch.ops.load_library is expected to work on the GPU machine; it needs
libcudart.so.13 and libcuda.so.1, so it cannot load on a CPU-only machine. scripts/prepare_topk_deps.sh
extracts it (60.8 MiB as xz: one device call of its own) into .device-deps/topk/vllm_C/.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from difftest.backends.topk_base import TopkBackend, deps_dir
from difftest.core import hardware
from difftest.core.errors import first_line
from difftest.core.kinds import IndexConvention, RowStride, TopkPadding, WindowForm
from difftest.core.topk import TopkContract, TopkInputs

SO_NAME = "vllm_C/_C_stable_libtorch.abi3.so"
WORKSPACE_BYTES = 1024 * 1024  # RADIX_TOPK_WORKSPACE_SIZE
RADIX_KS = (512, 1024, 2048)
COOPERATIVE_MAX_ROWS = 64  # AUTO_COOPERATIVE_MAX_ROWS


@dataclasses.dataclass(frozen=True)
class VllmKernel:
    """One of the four ops: its name in torch.ops._C and the facts its contract declares."""

    op: str
    window: WindowForm
    ks: tuple[int, ...] | None = None
    max_rows: int | None = None
    row_stride: RowStride = RowStride.ANY
    archs: tuple[str, ...] | None = None


KERNELS = {
    "vllm-top-k-per-row-prefill": VllmKernel("top_k_per_row_prefill", WindowForm.STARTS_ENDS),
    "vllm-top-k-per-row-decode": VllmKernel("top_k_per_row_decode", WindowForm.DECODE_RULE),
    "vllm-persistent-topk": VllmKernel("persistent_topk", WindowForm.LENGTHS, ks=RADIX_KS),
    "vllm-cooperative-topk": VllmKernel("cooperative_topk", WindowForm.LENGTHS, ks=RADIX_KS,
                                        max_rows=COOPERATIVE_MAX_ROWS, row_stride=RowStride.MULTIPLE_OF_4,
                                        archs=("sm90", "sm100", "sm103")),
}


def library_path() -> str:
    """Where the .so is looked for."""
    return str(deps_dir() / SO_NAME)


@functools.lru_cache(maxsize=1)
def _load() -> str | None:
    """Load the .so once into torch.ops._C; why it cannot be loaded, or None."""
    try:
        torch.ops.load_library(library_path())
    except (OSError, RuntimeError) as exc:
        return f"torch.ops.load_library({library_path()!r}) failed: {first_line(exc)}"
    return None


class VllmTopk:
    """One of vLLM's compiled top-k ops (KERNELS[name]), its buffers allocated as the indexer allocates them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.kernel = KERNELS[name]
        self.contract = TopkContract(
            index=IndexConvention.ROW_RELATIVE, padding=TopkPadding.PAST_WINDOW, window=self.kernel.window,
            ks=self.kernel.ks, max_rows=self.kernel.max_rows, row_stride=self.kernel.row_stride,
            devices=("cuda",), archs=self.kernel.archs, library=f"vllm 0.33.0 _C ({library_path()})")

    def unavailable_reason(self, device: str) -> str | None:
        """Why the op cannot run on `device`, most basic cause first; None when it can."""
        if device != "cuda":
            return f"{self.kernel.op} is a CUDA kernel of vllm's compiled extension: it runs on 'cuda' only"
        if not (deps_dir() / SO_NAME).is_file():
            return f"{library_path()} not found: scripts/prepare_topk_deps.sh extracts it from the vllm 0.33.0 wheel"
        reason = hardware.cuda_unavailable_reason() or _load()
        if reason:
            return reason
        if not hasattr(torch.ops._C, self.kernel.op):
            return f"{library_path()} registers no torch.ops._C.{self.kernel.op}"
        return None

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """int32 [rows, k] indices relative to each window's start, -1 past the window length."""
        logits, k, rows = inputs.logits, inputs.k, inputs.rows
        # A worker process never asked unavailable_reason: the .so is loaded where the call runs
        reason = _load()
        if reason:
            raise RuntimeError(reason)
        indices = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
        op = getattr(torch.ops._C, self.kernel.op)
        if self.kernel.window == WindowForm.STARTS_ENDS:
            op(logits, inputs.row_starts, inputs.row_ends, indices, rows, logits.stride(0), logits.stride(1), k)
        elif self.kernel.window == WindowForm.DECODE_RULE:
            op(logits, inputs.next_n, inputs.seq_lens, indices, rows, logits.stride(0), logits.stride(1), k)
        else:
            workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=logits.device)
            longest = int(inputs.lengths.max()) if rows else 0
            op(logits, inputs.lengths, indices, workspace, k, longest)
        return indices


TOPK_BACKENDS: dict[str, Callable[[], TopkBackend]] = {name: functools.partial(VllmTopk, name) for name in KERNELS}
