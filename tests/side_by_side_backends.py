"""Eleven copies of one correct Triton paged MQA logits kernel, and one planted copy, for running many
backends side by side at production sizes (scripts/device_visit.sh side-by-side): the harness's memory, not
the kernels, decides whether they fit the GPU together, and no copy may get a verdict from that.

The copies differ only in their names (triton-copy-00 .. triton-copy-10); triton-copy-planted loses
the last key of every window (FAIL(mask)), so a run of ten copies and it shows a real bug still found
beside them. The kernel (tests/side_by_side_kernel.py) is compiled on a GPU and interpreted on the CPU
(the same backends run `difftest run --device cpu`, at the CPU's small scale). Its envelope is the
production one: H 16-128 (powers of two), D 32/64/128, block 16/32/64, any next_n and context; it
allocates its fp32 output itself and nothing else, and declares no working memory.

    difftest run --device cuda --backends tests.side_by_side_backends:Copy00,...,tests.side_by_side_backends:Copy10
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from types import ModuleType

import torch
import triton

from difftest.core.contract import Contract
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from difftest.core.triton_interpret import interpreter_compat, load_kernel_module

KERNEL_FILE = Path(__file__).with_name("side_by_side_kernel.py")
CONTRACT = Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                    mask=MaskConvention.TAIL_NEG_INF, rtol=1e-6, block_sizes=(16, 32, 64), head_dims=(32, 64, 128),
                    heads_multiple_of=16, heads_power_of_two=True,
                    library=f"triton {triton.__version__} (tests.side_by_side_backends)")


@functools.cache
def _kernels(interpret: bool) -> ModuleType:
    return load_kernel_module(KERNEL_FILE, "side_by_side_kernel", interpret)


class _Copy:
    """One copy of the kernel as a backend; the subclasses name it (and plant the bug)."""

    name = "triton-copy"
    plant = 0
    contract = CONTRACT

    def unavailable_reason(self, device: str) -> str | None:
        if device == "cuda" and not torch.cuda.is_available():
            return "needs a GPU torch can see for --device cuda (it runs interpreted with --device cpu)"
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        _, next_n, heads, dim = inputs.q.shape
        interpret = inputs.q.device.type != "cuda"
        logits = torch.empty(inputs.rows, inputs.max_model_len, dtype=torch.float32, device=inputs.q.device)
        grid = (inputs.rows, inputs.block_table.shape[1])
        kernel = _kernels(interpret).paged_mqa_logits  # loaded before the interpreter's shims are in place
        with interpreter_compat() if interpret else contextlib.nullcontext():
            kernel[grid](
                inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens, inputs.block_table, logits,
                inputs.block_table.stride(0), inputs.max_model_len, NEXT_N=next_n, H=heads, D=dim,
                BLOCK=inputs.block_size, PLANT=self.plant)
        return logits


class Copy00(_Copy):
    name = "triton-copy-00"


class Copy01(_Copy):
    name = "triton-copy-01"


class Copy02(_Copy):
    name = "triton-copy-02"


class Copy03(_Copy):
    name = "triton-copy-03"


class Copy04(_Copy):
    name = "triton-copy-04"


class Copy05(_Copy):
    name = "triton-copy-05"


class Copy06(_Copy):
    name = "triton-copy-06"


class Copy07(_Copy):
    name = "triton-copy-07"


class Copy08(_Copy):
    name = "triton-copy-08"


class Copy09(_Copy):
    name = "triton-copy-09"


class Copy10(_Copy):
    name = "triton-copy-10"


class Planted(_Copy):
    """PLANT = 1: every row loses the last key of its window."""

    name = "triton-copy-planted"
    plant = 1


COPIES = (Copy00, Copy01, Copy02, Copy03, Copy04, Copy05, Copy06, Copy07, Copy08, Copy09, Copy10)
