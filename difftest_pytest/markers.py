"""Markers: `difftest(...)` restricts the fixtures of one test; `gpu`, `sm90`, `sm100`, `gfx942` and
`gfx950` skip a test at collection, with the exact reason, where the hardware is not there."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from difftest.core.hardware import CUDA_UNAVAILABLE, Hardware

MARKERS = (
    "difftest(backends=None, next_n=None): run difftest_backend over these backend names only (among the "
    "selected ones) and difftest_case over copies of every case with these next_n values",
    "gpu: needs a CUDA GPU (skipped with the reason where torch sees none)",
    "sm90: needs an NVIDIA sm90 (Hopper) GPU",
    "sm100: needs an NVIDIA sm100 (Blackwell) GPU",
    "gfx942: needs a ROCm gfx942 (MI300) GPU and a ROCm build of torch",
    "gfx950: needs a ROCm gfx950 (MI350) GPU and a ROCm build of torch",
)
HARDWARE = ("gpu", "sm90", "sm100", "gfx942", "gfx950")
DIFFTEST_KWARGS = ("backends", "next_n")


def register(config: pytest.Config) -> None:
    """Declare every marker with its signature, so --strict-markers accepts them."""
    for line in MARKERS:
        config.addinivalue_line("markers", line)


def skip_reason(marker: str, hw: Hardware) -> str | None:
    """Why a test marked `marker` cannot run on `hw`; None when it can."""
    if marker.startswith("gfx"):
        if not hw.rocm:
            return f"needs ROCm {marker}: not a ROCm build of torch"
        if not hw.gpu:
            return f"needs ROCm {marker}: {CUDA_UNAVAILABLE}"
        return None if hw.arch == marker else f"needs ROCm {marker}, this GPU is {hw.arch}"
    if not hw.gpu:
        return f"needs {'a CUDA GPU' if marker == 'gpu' else marker}: {CUDA_UNAVAILABLE}"
    if marker == "gpu" or hw.arch == marker:
        return None
    return f"needs {marker}, this GPU is {hw.arch}"


def skip_missing_hardware(items: Sequence[pytest.Item]) -> None:
    """Add a skip with the reason to every item whose hardware marker this machine does not meet."""
    marked = [(item, name) for item in items for name in HARDWARE if item.get_closest_marker(name)]
    if not marked:
        return  # torch stays unimported for runs that use no hardware marker
    hw = Hardware.probe()
    for item, name in marked:
        reason = skip_reason(name, hw)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def difftest_restrictions(marker: pytest.Mark | None) -> tuple[tuple[str, ...] | None, tuple[int, ...] | None]:
    """(backends, next_n) of a `difftest` marker, each None when not given; a misuse fails collection."""
    if marker is None:
        return None, None
    unknown = sorted(set(marker.kwargs) - set(DIFFTEST_KWARGS))
    if marker.args or unknown:
        pytest.fail(f"difftest marker: {marker.args or unknown}: expected keyword arguments among "
                    f"{list(DIFFTEST_KWARGS)}", pytrace=False)
    backends = marker.kwargs.get("backends")
    next_n = marker.kwargs.get("next_n")
    if isinstance(backends, str):
        backends = (backends,)
    if isinstance(next_n, int):
        next_n = (next_n,)
    if next_n is not None and not all(isinstance(n, int) and n >= 1 for n in next_n):
        pytest.fail(f"difftest marker: next_n={next_n!r}: expected integers >= 1", pytrace=False)
    return (tuple(backends) if backends is not None else None, tuple(next_n) if next_n is not None else None)
