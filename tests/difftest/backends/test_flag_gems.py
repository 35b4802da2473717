"""FlagGems 5.0.2's paged MQA logits schedule (difftest.backends.flag_gems), from the release wheel's file,
under the Triton interpreter, against two other schedules of the same units:

* FlashInfer 0.7.2.post1's numpy `_compute_schedule_metadata` (flashinfer/attn_scores/attn_scores.py:854),
  from its wheel's file: the same rule (the first `total % num_sms` SMs take one unit more), written
  independently, so the two must agree entry for entry;
* DeepGEMM 2.8.1's sm90 scheduler as vLLM 0.33.0 and 0.34.0 vendor it (include/deep_gemm/scheduler/
  sm90_paged_mqa_logits.cuh:98-140, non-varlen branch), transcribed below: a partition of the same units
  with the remainder on the last SMs, so the two differ in where the ranges fall and must not differ in
  what they cover.

Whether DeepGEMM's kernel computes every row right from FlagGems' schedule is the GPU's question
(backend deepgemm-flaggems-schedule, scripts/device_visit.sh field).
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from difftest.backends import carried, deep_gemm, load_backend
from difftest.backends import flag_gems as fg
from difftest.core.triton_interpret import load_kernel_defs

SPLIT_KV = 256  # both: units of 256 key positions
FLASHINFER_FILE = "flashinfer/attn_scores/attn_scores.py"

lengths_st = st.lists(st.sampled_from([0, 1, 255, 256, 257]) | st.integers(0, 3000), min_size=1, max_size=12)
sms_st = st.integers(1, 12)


@pytest.fixture(scope="module")
def flag_gems_file(field_tree: Path) -> carried.CarriedFile:
    return carried.find((fg.FILE,), [str(field_tree / "flag_gems-5.0.2")])


@pytest.fixture(scope="module")
def flashinfer_schedule(field_tree: Path):
    """FlashInfer's numpy schedule, executed from its file with the module constant it reads."""
    path = field_tree / "flashinfer-0.7.2.post1" / FLASHINFER_FILE
    constant = next(node.value for node in ast.parse(path.read_text()).body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "_COMPUTE_BLOCK_KV" for t in node.targets))
    module = load_kernel_defs(path, ("_compute_schedule_metadata",), "difftest_test_flashinfer_schedule", False,
                              {"np": np, "torch": torch, "_COMPUTE_BLOCK_KV": ast.literal_eval(constant)})
    return module._compute_schedule_metadata


def flag_gems(found: carried.CarriedFile, lengths, num_sms: int) -> list[tuple[int, int]]:
    table = torch.tensor(lengths, dtype=torch.int32)
    return [tuple(entry) for entry in fg.schedule(found, table, 64, num_sms).tolist()]


def deep_gemm_281(lengths: list[int], num_sms: int) -> list[tuple[int, int]]:
    """sm90_paged_mqa_logits.cuh:98-140 (non-varlen, one next_n atom): reversed remainder, the request
    clamped to B - 1, only sentinels when nothing is to be done."""
    batch = len(lengths)
    prefix = list(itertools.accumulate(math.ceil(n / SPLIT_KV) for n in lengths))
    total = prefix[-1]
    if total == 0:
        return [(batch, 0)] * (num_sms + 1)
    q, r = divmod(total, num_sms)
    pivot = num_sms - r
    out = []
    for sm in range(num_sms):
        start = sm * q + (sm - pivot if sm > pivot else 0)
        request = min(bisect.bisect_right(prefix, start), batch - 1)
        before = prefix[request - 1] if request else 0
        units = prefix[request] - before
        offset = start - before
        out.append((request, offset % units if units else 0))  # atom offset // units is 0 with one atom
    return [*out, (batch, 0)]


def unit_starts(schedule: list[tuple[int, int]], lengths: list[int]) -> list[int]:
    """Each entry as the index of the unit it starts at, among all requests' units end to end."""
    prefix = [0, *itertools.accumulate(math.ceil(n / SPLIT_KV) for n in lengths)]
    return [prefix[min(request, len(lengths))] + split for request, split in schedule]


@given(lengths_st, sms_st)
def test_flag_gems_and_flashinfer_write_the_same_schedule(flag_gems_file, flashinfer_schedule, lengths, num_sms):
    theirs = [tuple(e) for e in flashinfer_schedule(torch.tensor(lengths, dtype=torch.int32), num_sms).tolist()]
    assert flag_gems(flag_gems_file, lengths, num_sms) == theirs


@given(lengths_st, sms_st)
def test_flag_gems_and_deep_gemm_cut_the_same_units_with_the_remainder_at_opposite_ends(flag_gems_file, lengths,
                                                                                        num_sms):
    ours, theirs = flag_gems(flag_gems_file, lengths, num_sms), deep_gemm_281(lengths, num_sms)
    starts, their_starts = unit_starts(ours, lengths), unit_starts(theirs, lengths)
    total = sum(math.ceil(n / SPLIT_KV) for n in lengths)
    assert starts[0] == 0 and starts[-1] == total and starts == sorted(starts)
    assert ours[-1] == theirs[-1] == (len(lengths), 0)
    if total:
        q, r = divmod(total, num_sms)
        shares = [b - a for a, b in itertools.pairwise(starts)]
        assert shares == [q + 1] * r + [q] * (num_sms - r)
        assert [b - a for a, b in itertools.pairwise(their_starts)] == shares[::-1]


def test_the_smallest_schedules_that_differ(flag_gems_file):
    """L = [300, 0, 5] on 8 SMs, 3 units: FlagGems gives SMs 0-2 one unit each and starts the five idle
    SMs at the sentinel (3, 0); DeepGEMM idles SMs 0-4 at (0, 0) and gives SMs 5-7 the units. All-zero
    lengths: FlagGems starts every SM at (3, 0) too; DeepGEMM writes only sentinels."""
    assert flag_gems(flag_gems_file, [300, 0, 5], 8) == [(0, 0), (0, 1), (2, 0)] + [(3, 0)] * 6
    assert deep_gemm_281([300, 0, 5], 8) == [(0, 0)] * 6 + [(0, 1), (2, 0), (3, 0)]
    assert flag_gems(flag_gems_file, [0, 0, 0], 4) == deep_gemm_281([0, 0, 0], 4) == [(3, 0)] * 5


def test_two_dimensional_lengths_are_read_by_their_last_column(flag_gems_file):
    """get_paged_mqa_logits_metadata.py:65-67: a (B, next_n) table schedules by each request's last
    (longest) row, as DeepGEMM's scheduler does (cuh:59-60)."""
    table = [[255, 256], [0, 1], [511, 512], [0, 0]]
    assert flag_gems(flag_gems_file, table, 3) == flag_gems(flag_gems_file, [256, 1, 512, 0], 3)


def test_the_backend_is_deep_gemms_native_variant_with_flag_gems_schedule(on_path):
    folder = on_path("flag_gems-5.0.2")
    backend = load_backend(fg.NAME)
    native = load_backend("deepgemm").contract
    # DeepGEMM's batch limit is its metadata kernel's shared memory, the kernel FlagGems' schedule replaces.
    assert native.max_batch == deep_gemm.SM90_MAX_BATCH == 58112
    assert backend.contract == dataclasses.replace(native, max_batch=None, library=(
        f"{native.library}; schedule: flag-gems 5.0.2 (get_paged_mqa_logits_metadata from {folder / fg.FILE})"))
    assert backend.backend.variant is deep_gemm.VARIANTS["deepgemm"]
    assert backend.unavailable_reason("cpu") == "DeepGEMM runs on CUDA GPUs only (device cpu)"
