"""Backends that run out of memory, for the out-of-memory tests: `--backend-module tests.memory_backends:<name>`.

Each is right (the oracle's formula on what it is handed) except that it raises torch.OutOfMemoryError,
as a kernel on a full GPU does, under one condition:

    oom_beside_others   when another call is in flight beside it: right when it runs alone
    oom_on_first_call   on its first call under a folder (in-process, where calls never overlap)
    oom_always          always: it does not fit even alone
    aborts_out_of_memory  kills its process as a C++ library does on a failed CUDA allocation (an uncaught
                        c10::Error: 'what():  CUDA error: out of memory', then abort): under isolation
                        its worker dies, and the text it left is all that says why

Calls see each other through a marker-file protocol in the folder MARKERS names (a test's tmp_path,
handed to worker processes in their environment): each call of oom_beside_others and marks_its_call
creates a marker file for as long as it runs, and waits up to OVERLAP_SECONDS for another call's
marker to appear, keeping its own HOLD_SECONDS longer once it has seen one (so the other sees it too).
Each call appends 'name overlapped' or 'name alone' to the folder's calls.log.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from difftest.backends.user import backend
from difftest.core.contract import Contract
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from tests.user_backends import logits_with_limits

CONTRACT = Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                    mask=MaskConvention.TAIL_NEG_INF, rtol=1e-6, library="tests.memory_backends")
MARKERS = "DIFFTEST_TEST_MARKERS"  # the folder of the marker-file protocol
OVERLAP_SECONDS = 0.5  # how long a call looks for another one beside it
HOLD_SECONDS = 0.2  # how long a call keeps its marker once it has seen another (> the poll interval)
POLL_SECONDS = 0.01
OUT_OF_MEMORY = "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 139.81 GiB"


def _folder() -> Path:
    return Path(os.environ[MARKERS])


def _beside_another(name: str) -> bool:
    """Whether another call's marker shows up while this call's is there (up to OVERLAP_SECONDS); logged."""
    mine = _folder() / f"{name}.{os.getpid()}.{time.monotonic_ns()}.running"
    mine.touch()
    try:
        deadline = time.monotonic() + OVERLAP_SECONDS
        seen = False
        while not seen and time.monotonic() < deadline:
            seen = any(path != mine for path in _folder().glob("*.running"))
            time.sleep(0 if seen else POLL_SECONDS)
        if seen:
            time.sleep(HOLD_SECONDS)
    finally:
        mine.unlink()
    with (_folder() / "calls.log").open("a") as log:
        log.write(f"{name} {'overlapped' if seen else 'alone'}\n")
    return seen


@backend(contract=CONTRACT, name="oom-beside-others")
def oom_beside_others(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Out of memory when another call runs beside it, right when it runs alone: a correct kernel whose
    buffers fit the GPU only when it has it to itself."""
    if _beside_another("oom-beside-others"):
        raise torch.OutOfMemoryError(OUT_OF_MEMORY)
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)


@backend(contract=CONTRACT, name="marks-its-call")
def marks_its_call(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Right; takes part in the marker protocol, so a call beside it sees it."""
    _beside_another("marks-its-call")
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)


@backend(contract=CONTRACT, name="oom-on-first-call")
def oom_on_first_call(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Out of memory on its first call under the MARKERS folder, right on every later one: in-process
    calls never overlap, so this stands for a first call made while other calls' inputs held memory."""
    first = _folder() / "oom-on-first-call.done"
    if not first.exists():
        first.touch()
        raise torch.OutOfMemoryError(OUT_OF_MEMORY)
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)


@backend(contract=CONTRACT, name="oom-always")
def oom_always(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Out of memory on every call, alone too: it never fits."""
    raise torch.OutOfMemoryError(OUT_OF_MEMORY)


@backend(contract=CONTRACT, name="aborts-out-of-memory")
def aborts_out_of_memory(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Dies of SIGABRT after printing what an uncaught c10::Error prints for a failed CUDA allocation."""
    sys.stderr.write("terminate called after throwing an instance of 'c10::Error'\n"
                     "  what():  CUDA error: out of memory\n")
    sys.stderr.flush()
    os.abort()
