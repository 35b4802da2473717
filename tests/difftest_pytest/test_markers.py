"""Hardware markers: registered with their signatures, skipped at collection with the exact reason."""

from __future__ import annotations

import pytest
import torch

from difftest.core.hardware import Hardware
from difftest_pytest.markers import skip_reason

NO_GPU = Hardware(gpu=False, rocm=False, arch=None)
CUDA_SM90 = Hardware(gpu=True, rocm=False, arch="sm90")
CUDA_SM100 = Hardware(gpu=True, rocm=False, arch="sm100")
ROCM_NO_GPU = Hardware(gpu=False, rocm=True, arch=None)
ROCM_GFX942 = Hardware(gpu=True, rocm=True, arch="gfx942")


def test_markers_are_registered_with_their_signatures(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.difftest(backends=None, next_n=None): *", "@pytest.mark.gpu: *",
                                 "@pytest.mark.sm90: *", "@pytest.mark.sm100: *", "@pytest.mark.gfx942: *",
                                 "@pytest.mark.gfx950: *"])


@pytest.mark.skipif(torch.cuda.is_available() or torch.version.hip is not None,
                    reason="the exact reasons below are those of a CPU-only CUDA build of torch")
def test_on_this_cpu_only_machine_each_marker_skips_with_its_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.gpu
        def test_gpu(): pass

        @pytest.mark.sm90
        def test_sm90(): pass

        @pytest.mark.sm100
        def test_sm100(): pass

        @pytest.mark.gfx942
        def test_gfx942(): pass

        @pytest.mark.gfx950
        def test_gfx950(): pass

        def test_plain(): pass
    """)
    result = pytester.runpytest_inprocess("-rs", "--strict-markers")
    result.assert_outcomes(passed=1, skipped=5)
    result.stdout.fnmatch_lines_random([
        "SKIPPED [[]1] *: needs a CUDA GPU: torch.cuda.is_available() is False",
        "SKIPPED [[]1] *: needs sm90: torch.cuda.is_available() is False",
        "SKIPPED [[]1] *: needs sm100: torch.cuda.is_available() is False",
        "SKIPPED [[]1] *: needs ROCm gfx942: not a ROCm build of torch",
        "SKIPPED [[]1] *: needs ROCm gfx950: not a ROCm build of torch",
    ])


@pytest.mark.parametrize(("marker", "hw", "reason"), [
    ("gpu", NO_GPU, "needs a CUDA GPU: torch.cuda.is_available() is False"),
    ("gpu", CUDA_SM90, None),
    ("gpu", ROCM_GFX942, None),
    ("sm90", NO_GPU, "needs sm90: torch.cuda.is_available() is False"),
    ("sm90", CUDA_SM100, "needs sm90, this GPU is sm100"),
    ("sm90", CUDA_SM90, None),
    ("sm100", CUDA_SM100, None),
    ("sm90", ROCM_GFX942, "needs sm90, this GPU is gfx942"),
    ("gfx942", CUDA_SM90, "needs ROCm gfx942: not a ROCm build of torch"),
    ("gfx942", ROCM_NO_GPU, "needs ROCm gfx942: torch.cuda.is_available() is False"),
    ("gfx950", ROCM_GFX942, "needs ROCm gfx950, this GPU is gfx942"),
    ("gfx942", ROCM_GFX942, None),
])
def test_skip_reason(marker: str, hw: Hardware, reason: str | None) -> None:
    assert skip_reason(marker, hw) == reason
