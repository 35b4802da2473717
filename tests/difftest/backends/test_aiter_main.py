"""AITER's main branch as a second version of the aiter-triton backends (aiter_triton_paged).

The tree is what scripts/prepare_versions.sh copies from a checkout of ROCm/aiter into
.device-deps/versions/aiter-main (never committed); put first on sys.path it shadows the installed
amd-aiter. Where it is absent (CI) these tests skip saying so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from difftest.backends import aiter_triton, aiter_triton_paged, load_backend
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import CaseSpec, build_case

TREE = Path(__file__).resolve().parents[3] / ".device-deps/versions/aiter-main"
pytestmark = pytest.mark.skipif(
    not (TREE / "aiter" / aiter_triton.KERNEL_FILES[1]).is_file(),
    reason=f"no {TREE / 'aiter' / aiter_triton.KERNEL_FILES[1]}: scripts/prepare_versions.sh copies it from a "
           f"checkout of ROCm/aiter")


@pytest.fixture(autouse=True)
def aiter_main(monkeypatch):
    """The main tree first on sys.path, as PYTHONPATH=.device-deps/versions/aiter-main puts it."""
    monkeypatch.syspath_prepend(str(TREE))


def test_the_non_ragged_kernels_are_of_the_paged_generation():
    for name in ("aiter-triton-stage1", "aiter-triton-fused"):
        made = load_backend(name)
        assert aiter_triton.is_paged(made.backend.variant), name
        c = made.contract
        assert (c.cache_layout, c.block_sizes, c.tiles) == (CacheLayout.BLOCK_SPLIT, aiter_triton_paged.BLOCK_SIZES,
                                                            (aiter_triton_paged.CHUNK_K,)), name
        assert c.mask == (MaskConvention.TAIL_NEG_INF if "stage1" in name else MaskConvention.TAIL_UNSPECIFIED)
        assert c.library == f"amd-aiter {aiter_triton.aiter_version()} ({aiter_triton.kernel_file()})"
        assert str(TREE) in c.library and made.unavailable_reason("cpu") is None


def mtp_cases(batch: int, lengths: tuple[int, ...]) -> list:
    return [build_case(CaseSpec(batch=batch, next_n=3, heads=16, head_dim=32, block_size=64, max_model_len=512,
                                lengths=lengths), 0)]


def test_the_fused_kernel_agrees_with_the_oracle_on_per_sequence_lengths():
    results = run([load_backend("aiter-triton-fused")], mtp_cases(4, (3, 64, 129, 300)), RunConfig(isolate=False))
    assert [r.verdict for r in results] == [Verdict.PASS], [(r.case, r.verdict, r.reason) for r in results]


def test_the_vllm_59420_scenario_side_by_side():
    """B = 16, next_n = 3 on main's fused kernel, which reads one length per sequence: fed vLLM's
    per-row table (what vLLM passed before it took the last column, vllm#59420) every row's window is
    wrong; fed per-sequence lengths none is. The verdict is FAIL(unwritten): where a row's window is
    read too short, positions inside the true one keep the poison of vLLM's unfilled workspace."""
    lengths = tuple(range(40, 440, 25))
    fused = load_backend("aiter-triton-fused")
    (right,) = run([fused], mtp_cases(16, lengths), RunConfig(isolate=False))
    (wrong,) = run([fused], mtp_cases(16, lengths), RunConfig(isolate=False, encoding=LengthEncoding.PER_ROW))
    assert (right.verdict, len(right.comparison.mask_rows)) == (Verdict.PASS, 0)
    assert (wrong.verdict, len(wrong.comparison.mask_rows)) == (Verdict.FAIL_UNWRITTEN, 48)
