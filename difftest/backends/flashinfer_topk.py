"""FlashInfer 0.7.2.post1's ragged top-k, `flashinfer.topk.top_k_ragged_transform` (flashinfer/topk.py:1330),
called as vLLM's `flashinfer` decode top-k calls it (vllm/model_executor/layers/indexer_topk.py:343-357:
zero offsets, the row ends as lengths) with SGLang's row_starts where a window starts past 0.

`top_k_ragged_transform(input, offsets, lengths, k, deterministic=False, tie_break=0, dsa_graph_safe=False,
row_starts=None)`: window `[row_starts[i], row_starts[i] + lengths[i])`, `out[i, j] = local + offsets[i]`
(local: relative to row_starts), -1 past the length, a window of at most k returning all its positions;
int32. fp32/fp16/bf16, the whole input contiguous: the binding checks `CHECK_INPUT(input)` (data/csrc/topk.cu:182,
contiguity included), so rows padded past the width raise "input must be contiguous" (seen on the H200 before
the contract said so). k <= 2048 on the FilteredTopK path (CUB beyond). No order promised unless deterministic.

The module is JIT-built at first use (flashinfer/jit/topk.py:21-31: data/csrc/topk.cu, cub_topk.cu and two
bindings) with $CUDA_HOME/bin/nvcc through ninja and apache-tvm-ffi; it needs `curand.h` under
$CUDA_HOME/include. Compile-only on a 2-core CPU machine (nvcc 13.0.88, sm_90a): topk.cu 271 s, cub_topk.cu
671 s, the bindings 4 s and 26 s, more than a device call: `scripts/prepare_topk_deps.sh flashinfer-aot` builds
it ahead with its own JitSpec and `scripts/device_visit.sh topk` puts it in flashinfer/data/aot/, which FlashInfer
loads before building anything. The package's Python tree and its top-k sources travel in
.device-deps/topk/flashinfer/ (scripts/prepare_topk_deps.sh).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from difftest.backends.topk_base import TopkBackend
from difftest.core import hardware
from difftest.core.kinds import IndexConvention, RowStride, TopkPadding, WindowForm
from difftest.core.topk import TopkContract, TopkInputs

MAX_K = 2048  # FilteredTopK's bound (flashinfer/topk.py:649-670)


def _cuda_home() -> Path | None:
    home = os.environ.get("CUDA_HOME")
    if home:
        return Path(home)
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parent.parent if nvcc else None


class FlashInferTopk:
    """top_k_ragged_transform with zero offsets: indices relative to each window's start."""

    name = "flashinfer-top-k-ragged"
    contract = TopkContract(index=IndexConvention.ROW_RELATIVE, padding=TopkPadding.PAST_WINDOW,
                            window=WindowForm.STARTS_LENGTHS, max_k=MAX_K, row_stride=RowStride.EQUALS_WIDTH,
                            devices=("cuda",),
                            archs=("sm90", "sm100", "sm103"), library="flashinfer-python 0.7.2.post1 (JIT)")

    def unavailable_reason(self, device: str) -> str | None:
        """Why FlashInfer's top-k cannot be built or run on `device`, most basic cause first; None when it can."""
        if device != "cuda":
            return "FlashInfer's top-k is CUDA only (JIT-built with nvcc at first use)"
        if importlib.util.find_spec("flashinfer") is None:
            return ("flashinfer is not on sys.path: scripts/prepare_topk_deps.sh extracts it into "
                    ".device-deps/topk/flashinfer and scripts/device_visit.sh topk puts it on PYTHONPATH")
        if importlib.util.find_spec("tvm_ffi") is None:
            return "apache-tvm-ffi is not importable (scripts/device_visit.sh topk installs the carried wheel)"
        home = _cuda_home()
        if home is None or not (home / "bin" / "nvcc").exists():
            return "no nvcc (CUDA_HOME unset and none on PATH): FlashInfer builds its top-k at first use"
        if not (home / "include" / "curand.h").exists():
            return f"{home / 'include' / 'curand.h'} is missing: FlashInfer's topk.cu includes it"
        return hardware.cuda_unavailable_reason()

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """int32 [rows, k] from top_k_ragged_transform."""
        from flashinfer.topk import top_k_ragged_transform  # deferred: importing flashinfer initialises CUDA

        offsets = torch.zeros(inputs.rows, dtype=torch.int32, device=inputs.logits.device)
        return top_k_ragged_transform(inputs.logits, offsets, inputs.lengths, inputs.k, row_starts=inputs.row_starts)


TOPK_BACKENDS: dict[str, Callable[[], TopkBackend]] = {"flashinfer-top-k-ragged": FlashInferTopk}
