"""What one SM holds at once: CUDA's occupancy rules for registers, shared memory, threads and blocks."""

from __future__ import annotations

import pytest

from difftest.core.hardware import SmLimits

# An sm90 SM (H100, H200): 64 K registers, 228 KiB of shared memory, 2048 threads.
HOPPER = SmLimits(registers=65536, shared_bytes=233472, threads=2048)


@pytest.mark.parametrize(("threads", "registers", "shared", "blocks", "bound_by"), [
    (128, 168, 72 * 1024, 3, "registers: 168 x 32 = 5376 a warp, 12 warps"),
    (128, 255, 0, 2, "registers: 255 x 32 rounds up to 8192 a warp, 8 warps"),
    (128, 64, 100 * 1024, 2, "shared memory: 100 KiB + the 1 KiB kept per block"),
    (1024, 32, 0, 2, "threads: 2048 an SM"),
    (32, 16, 0, 32, "blocks: 32 an SM"),
    (256, 255, 0, 1, "registers, at least one"),
])
def test_resident_blocks(threads: int, registers: int, shared: int, blocks: int, bound_by: str) -> None:
    assert HOPPER.resident_blocks(threads, registers, shared) == blocks, bound_by


def test_shared_memory_counts_what_the_driver_keeps_per_block() -> None:
    exactly_two = HOPPER.shared_bytes // 2 - HOPPER.reserved_shared_bytes
    assert HOPPER.resident_blocks(128, 32, exactly_two) == 2
    assert HOPPER.resident_blocks(128, 32, exactly_two + 1) == 1


def test_require_device_names_the_field_and_why_only_where_the_device_is_missing(monkeypatch):
    from difftest.core import hardware
    from difftest.core.errors import SpecError

    hardware.require_device("cpu")
    monkeypatch.setattr(hardware, "cuda_unavailable_reason", lambda: "no driver")
    with pytest.raises(SpecError, match=r"bundle.json device='cuda': expected a device torch can see \(no driver\)"):
        hardware.require_device("cuda", "bundle.json device")
    monkeypatch.setattr(hardware, "cuda_unavailable_reason", lambda: None)
    hardware.require_device("cuda")
