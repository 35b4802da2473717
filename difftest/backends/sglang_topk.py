"""SGLang 0.5.23's JIT top-k kernels, the ones its DSA indexer runs by default on CUDA, built the way its
`load_jit` builds them (nvcc through apache-tvm-ffi) and called as its wrappers call them.

* `sglang-jit-topk-v2-ragged`: `topk_transform_ragged_v2(scores, seq_lens, out_offsets=, out_indices=,
  row_starts=)` (sglang/kernels/ops/attention/dsv4/topk.py:172-207), what prefill runs with
  SGLANG_OPT_USE_TOPK_V2 and SGLANG_DSA_FUSE_TOPK (both default True; dsa_topk_backend.py:431-459).
  `out = position + out_offsets[i]`; SGLang passes the ragged KV offset, which equals row_starts on a
  contiguous score matrix ("the production convention out_offsets == row_starts"), so indices are columns
  (ABSOLUTE); -1 past the window length. Checks (csrc/deepseek_v4/topk_v2.cuh:1460-1515): fp32, strides
  (S, 1) with S % 4 == 0, 0 < k <= 2048, non-negative lengths. It writes `scores` in place (the <= 3 columns
  before an unaligned window). Threshold-bin ties are capped at kMaxNumTie = 2048 (sglang#35257, open).
* `sglang-jit-fast-topk`: `fast_topk(score, lengths, topk, row_starts)` (ops/attention/fast_topk.py:38-70),
  k in {512, 2048}, indices relative to row_starts, -1 past the length; the threshold bin keeps at most 4096
  candidates (sglang#36807, open; seen on the H200: docs/findings/sglang-fast-topk-crowded-bin.md).

The sources travel in .device-deps/topk/sglang-0.5.23-topk/ (scripts/prepare_topk_deps.sh); the build needs
apache-tvm-ffi importable and nvcc for sm_90a. Compile-only on a 2-core CPU machine with nvcc 13.0.88: 17 s
(fast_topk) and 18 s (topk_v2 ragged) per module. The module is cached by tvm-ffi under ~/.cache/tvm-ffi.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from difftest.backends.topk_base import TopkBackend, deps_dir
from difftest.core import hardware
from difftest.core.kinds import IndexConvention, RowStride, TopkPadding, WindowForm
from difftest.core.topk import TopkContract, TopkInputs

SOURCES = "sglang-0.5.23-topk/sglang/kernels/jit"
# sglang/kernels/jit/utils/arch.py:39 and :131 and compile/paths.py:31: the flags its load_jit passes on sm90.
CUDA_FLAGS = ("-gencode=arch=compute_90a,code=sm_90a", "-DSGL_CUDA_ARCH=900", "-std=c++20", "-O3",
              "--expt-relaxed-constexpr")


@dataclasses.dataclass(frozen=True)
class JitKernel:
    """One entry point: the header, the C++ function exported, the name it is called by, its contract facts."""

    header: str
    function: str
    export: str
    index: IndexConvention
    row_stride: RowStride
    ks: tuple[int, ...] | None = None
    max_k: int | None = None
    mutates_logits: bool = False


KERNELS = {
    "sglang-jit-topk-v2-ragged": JitKernel("deepseek_v4/topk_v2.cuh", "sglang::TopKKernel<true>::transform_ragged",
                                           "topk_transform_ragged", IndexConvention.ABSOLUTE, RowStride.MULTIPLE_OF_4,
                                           max_k=2048, mutates_logits=True),
    "sglang-jit-fast-topk": JitKernel("elementwise/fast_topk.cuh", "sglang::FastTopKKernel<{k}, true>::run",
                                      "fast_topk", IndexConvention.ROW_RELATIVE, RowStride.ANY, ks=(512, 2048)),
}


def sources_dir() -> Path:
    """The carried JIT sources (csrc/ and include/)."""
    return deps_dir() / SOURCES


@functools.lru_cache(maxsize=8)
def _module(name: str, k: int) -> Any:
    """The tvm-ffi module of KERNELS[name] (at k for the templated fast_topk), built once per process."""
    import tvm_ffi.cpp  # deferred: only the GPU machine has apache-tvm-ffi

    kernel = KERNELS[name]
    export = f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({kernel.export}, ({kernel.function.format(k=k)}));"
    source = f"#include <{kernel.header}>\n{export}\n"
    return tvm_ffi.cpp.load_inline(
        f"difftest_{kernel.export}_k{k}", cuda_sources=source,
        extra_include_paths=[str(sources_dir() / "include"), str(sources_dir() / "csrc")],
        extra_cuda_cflags=list(CUDA_FLAGS))


class SglangJitTopk:
    """One of SGLang's JIT top-k entry points, its output buffer allocated as its wrapper allocates it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.kernel = KERNELS[name]
        self.contract = TopkContract(
            index=self.kernel.index, padding=TopkPadding.PAST_WINDOW, window=WindowForm.STARTS_LENGTHS,
            ks=self.kernel.ks, max_k=self.kernel.max_k, row_stride=self.kernel.row_stride,
            mutates_logits=self.kernel.mutates_logits, devices=("cuda",), archs=("sm90",),
            library=f"sglang 0.5.23 JIT {self.kernel.header} ({sources_dir()})")

    def unavailable_reason(self, device: str) -> str | None:
        """Why the kernel cannot be built or run on `device`, most basic cause first; None when it can."""
        if device != "cuda":
            return f"{self.kernel.export} is a CUDA kernel built by nvcc at first use: it runs on 'cuda' only"
        if not (sources_dir() / "csrc" / self.kernel.header).is_file():
            return f"{sources_dir() / 'csrc' / self.kernel.header} not found: scripts/prepare_topk_deps.sh extracts it"
        if importlib.util.find_spec("tvm_ffi") is None:
            return "apache-tvm-ffi is not importable (scripts/device_visit.sh topk installs the carried wheel)"
        if shutil.which("nvcc") is None:
            return "no nvcc on PATH: the JIT kernels are compiled at first use"
        return hardware.cuda_unavailable_reason()

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """int32 [rows, k]: columns (v2 ragged, out_offsets = row_starts) or positions relative to row_starts."""
        logits, k = inputs.logits, inputs.k
        module = _module(self.name, k)
        if self.kernel.export == "topk_transform_ragged":
            indices = logits.new_empty((inputs.rows, k), dtype=torch.int32)
            module.topk_transform_ragged(logits, inputs.lengths, inputs.row_starts, inputs.row_starts, indices)
            return indices
        indices = logits.new_empty((inputs.rows, k), dtype=torch.int32)
        module.fast_topk(logits, inputs.row_starts, indices, inputs.lengths)
        return indices


TOPK_BACKENDS: dict[str, Callable[[], TopkBackend]] = {name: functools.partial(SglangJitTopk, name)
                                                        for name in KERNELS}
