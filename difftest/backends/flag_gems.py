"""FlagGems 5.0.2's paged MQA logits schedule, driving DeepGEMM's kernel as a FlagGems-based caller would.

flag-gems 5.0.2 (PyPI: 4.2.0, 5.0.0, 5.0.2) holds no paged MQA logits kernel (its Triton ones are in git
tags v5.3.0+ only, never released); what it holds is DeepGEMM's other half, the schedule:
flag_gems/ops/get_paged_mqa_logits_metadata.py `get_paged_mqa_logits_metadata(context_lens, block_size,
num_sms) -> int32 [num_sms + 1, 2]`, a Triton kernel. A stack that replaces DeepGEMM's metadata call
with FlagGems' hands its result to DeepGEMM's `fp8_fp4_paged_mqa_logits`, which is what the one backend
here, `deepgemm-flaggems-schedule`, does: difftest.backends.deep_gemm's native variant with FlagGems'
schedule in place of DeepGEMM's own. What it tests is whether DeepGEMM's kernel computes every row
right from a schedule it did not make.

The two schedules are both partitions of ceil(L / 256) units per request (the last column of 2-D
lengths, :65-67 here, scheduler/sm90_paged_mqa_logits.cuh:59-62 in DeepGEMM 2.8.1) into contiguous
per-SM ranges ending in the sentinel (B, 0), and they differ: FlagGems gives the remainder's extra
units to the first SMs (:38-41), DeepGEMM 2.8.1 to the last (cuh:112-115); FlagGems starts idle SMs at
(B, 0), DeepGEMM clamps their request to B - 1 (cuh:126) and emits only sentinels when every length is
zero (cuh:101-111). `block_size` is ignored (SPLIT_KV = 256 always, :61) and there is no `indices`
parameter (DeepGEMM's sm100 varlen schedule has no FlagGems equivalent). The file imports only torch and
triton and is loaded by path, on the CPU under the Triton interpreter (the CPU tests compare the
schedules there). The package itself is not imported: flag-gems ships no compiled extension, but
`import flag_gems` looks for a GPU and raises without one ("No device were detected on your machine",
flag_gems/runtime/error.py), and on a GPU it registers its own aten implementations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import zlib
from collections.abc import Callable
from types import ModuleType

import torch

from difftest.backends import carried, deep_gemm
from difftest.backends.base import Backend
from difftest.core.contract import Contract
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.triton_interpret import interpreter_compat, load_kernel_module

FILE = "flag_gems/ops/get_paged_mqa_logits_metadata.py"
VERSION_FILES = ("flag_gems-*.dist-info/METADATA",)
RELEASE = "flag-gems 5.0.2"
FUNCTION = "get_paged_mqa_logits_metadata"
NAME = "deepgemm-flaggems-schedule"


def find() -> carried.CarriedFile | None:
    """The first copy of FlagGems' schedule file on sys.path (an installed flag_gems counts), or None."""
    return carried.find((FILE,))


def describe(found: carried.CarriedFile | None) -> str:
    """'flag-gems 5.0.2 (get_paged_mqa_logits_metadata from FILE)'."""
    if found is None:
        return f"flag-gems (no copy of {FILE} on sys.path)"
    return f"flag-gems {found.version(VERSION_FILES) or '(version unknown)'} ({FUNCTION} from {found.path})"


def load(found: carried.CarriedFile, interpret: bool) -> ModuleType:
    """The schedule file as a module: interpreted (CPU) or compiled (GPU)."""
    return load_kernel_module(found.path, f"difftest_flag_gems_{zlib.crc32(str(found.path).encode()):08x}", interpret)


def schedule(found: carried.CarriedFile, context_lens: torch.Tensor, block_size: int, num_sms: int) -> torch.Tensor:
    """FlagGems' schedule for `context_lens` on `num_sms` workers, on the lengths' device."""
    interpret = context_lens.device.type == "cpu"
    function = getattr(load(found, interpret), FUNCTION)
    with interpreter_compat() if interpret else contextlib.nullcontext():
        return function(context_lens, block_size, num_sms)


class DeepGemmFlagGemsSchedule(deep_gemm.DeepGemm):
    """DeepGEMM's native variant, its schedule metadata from FlagGems."""

    def __init__(self) -> None:
        super().__init__("deepgemm")
        self.name = NAME

    @property
    def contract(self) -> Contract:
        """DeepGEMM's native envelope (the kernel is DeepGEMM's) less its batch limit, which is its metadata
        kernel's shared memory (deep_gemm.SM90_MAX_BATCH): FlagGems' schedule replaces that kernel. `library`
        names both libraries."""
        native = super().contract
        return dataclasses.replace(native, max_batch=None, library=f"{native.library}; schedule: {describe(find())}")

    def unavailable_reason(self, device: str) -> str | None:
        """DeepGEMM's reason first, then a missing or unloadable schedule file."""
        why = super().unavailable_reason(device)
        found = find()
        if why or found is None:
            return why or carried.missing_reason((FILE,), RELEASE)
        try:
            load(found, interpret=False)
        except Exception as exc:  # no triton, a file without the function
            return f"loading {found.path} failed: {type(exc).__name__}: {exc}"
        return None

    def schedule(self, inputs: KernelInputs) -> torch.Tensor:
        """FlagGems' metadata for the step, with the arguments DeepGEMM's metadata call gets (the schedule
        slots halved at sm90 next_n = 4, as vLLM's wrapper sizes them)."""
        found = find()
        if found is None:
            raise RuntimeError(carried.missing_reason((FILE,), RELEASE))
        slots = self.num_sms(deep_gemm.loaded_module(), inputs.q.shape[1])
        return schedule(found, self.context_lens(inputs), inputs.block_size, slots)


BACKENDS: dict[str, Callable[[], Backend]] = {NAME: DeepGemmFlagGemsSchedule}
