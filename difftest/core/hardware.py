"""Hardware facts, asked in one place: is there a GPU (and if not, why), its arch, SMs, memory and
what one SM holds at once.

Backends, the runner, the planner and the pytest markers all ask here, so a reason reads the same
wherever it is printed. torch is imported inside each function: the plugin and `difftest --help`
import this module without paying for torch.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
from typing import Any

CUDA_UNAVAILABLE = "torch.cuda.is_available() is False"


class DeviceKind(str, enum.Enum):
    """A kind of machine a CI job runs on: the CPU, or a GPU arch as `arch()` names it."""

    CPU = "cpu"
    SM90 = "sm90"  # Hopper: H100, H200
    SM100 = "sm100"  # Blackwell: B200, GB200
    GFX942 = "gfx942"  # CDNA3: MI300X, MI325X
    GFX950 = "gfx950"  # CDNA4: MI350X, MI355X

    @property
    def device(self) -> str:
        """The torch device a run computes on: ROCm GPUs are 'cuda' to torch too."""
        return "cpu" if self is DeviceKind.CPU else "cuda"

    @property
    def arch(self) -> str | None:
        """What `arch()` reports on this kind's GPU; None for the CPU."""
        return None if self is DeviceKind.CPU else self.value


def cuda_unavailable_reason() -> str | None:
    """Why torch cannot run work on a GPU here, or None when it can."""
    import torch  # deferred: torch is heavy

    return None if torch.cuda.is_available() else CUDA_UNAVAILABLE


def is_rocm() -> bool:
    """Whether this torch is a ROCm build (its 'cuda' device is an AMD GPU)."""
    import torch  # deferred: torch is heavy

    return torch.version.hip is not None


def arch(index: int | None = None) -> str:
    """'sm90', 'sm100', ... of a CUDA GPU, or 'gfx942', 'gfx950', ... of a ROCm one (current device by default)."""
    import torch  # deferred: torch is heavy

    index = torch.cuda.current_device() if index is None else index
    if is_rocm():
        return torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


def sm_count(index: int | None = None) -> int:
    """Streaming multiprocessors (compute units on ROCm) of a GPU: the workers of a persistent kernel."""
    import torch  # deferred: torch is heavy

    index = torch.cuda.current_device() if index is None else index
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


@dataclasses.dataclass(frozen=True)
class SmLimits:
    """What one SM holds at once: the limits that decide how many blocks of a kernel run side by side."""

    registers: int  # 32-bit registers
    shared_bytes: int
    threads: int
    blocks: int = 32  # resident blocks, whatever their size (sm80 and later)
    register_unit: int = 256  # registers are given to a warp in units of this many
    reserved_shared_bytes: int = 1024  # shared memory the driver keeps per block (sm80 and later)

    @classmethod
    def of(cls, index: int | None = None) -> SmLimits | None:
        """The limits of a CUDA GPU (current device by default); None on ROCm, whose units differ."""
        import torch  # deferred: torch is heavy

        if is_rocm():
            return None
        props = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
        return cls(registers=int(props.regs_per_multiprocessor),
                   shared_bytes=int(props.shared_memory_per_multiprocessor),
                   threads=int(props.max_threads_per_multi_processor))

    def resident_blocks(self, threads: int, registers_per_thread: int, shared_bytes: int) -> int:
        """Blocks of `threads` threads, each thread holding `registers_per_thread` registers and each
        block `shared_bytes` of shared memory, that one SM runs at once (at least 1: a launch that fits
        at all runs one)."""
        warps = -(-threads // 32)
        per_warp = -(-registers_per_thread * 32 // self.register_unit) * self.register_unit
        by_registers = (self.registers // per_warp) // warps if per_warp else self.blocks
        by_shared = self.shared_bytes // (shared_bytes + self.reserved_shared_bytes)
        return max(1, min(self.blocks, self.threads // (warps * 32), by_registers, by_shared))


def free_memory(index: int | None = None) -> int:
    """Bytes a new allocation can still take on a GPU (the driver's free count plus torch's cache)."""
    import torch  # deferred: torch is heavy

    index = torch.cuda.current_device() if index is None else index
    free, _total = torch.cuda.mem_get_info(index)
    return int(free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index))


def host_free_memory() -> int | None:
    """Bytes of host memory free now (the OS's free pages), or None where the OS does not say: what a
    case archive may declare is bounded by it (difftest.core.schema.check_case_archive)."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def describe_gpu(index: int, props: Any, visible: str | None) -> str:
    """'cuda:{index} {name} (PCI {domain}:{bus}:{slot}.0, CUDA_VISIBLE_DEVICES={visible})' of
    torch.cuda.get_device_properties(index); the UUID where this torch does not expose the PCI address."""
    if hasattr(props, "pci_bus_id"):  # GPUs are PCI function 0
        where = f"PCI {props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    else:
        where = f"UUID {props.uuid}"
    return f"cuda:{index} {props.name} ({where}, CUDA_VISIBLE_DEVICES={'unset' if visible is None else visible})"


def gpu_description(device: Any) -> str | None:
    """The GPU a torch.device is (plain 'cuda': the current one); None on the CPU. Isolated workers
    inherit CUDA_VISIBLE_DEVICES and compute on its first device, as a run that never sets another
    current device does."""
    if device.type != "cuda":
        return None
    import torch  # deferred: torch is heavy

    index = torch.cuda.current_device() if device.index is None else device.index
    return _described(index, os.environ.get("CUDA_VISIBLE_DEVICES"))


@functools.cache
def _described(index: int, visible: str | None) -> str:
    """describe_gpu of a device index under one CUDA_VISIBLE_DEVICES: every result carries it (a fuzz
    campaign asked for it 20,000 times in 30 s)."""
    import torch  # deferred: torch is heavy

    return describe_gpu(index, torch.cuda.get_device_properties(index), visible)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What torch sees: a GPU at all, a ROCm build, and the current GPU's arch ('sm90', 'gfx942')."""

    gpu: bool
    rocm: bool
    arch: str | None

    @classmethod
    def probe(cls) -> Hardware:
        """The hardware of this process's current device."""
        gpu = cuda_unavailable_reason() is None
        return cls(gpu=gpu, rocm=is_rocm(), arch=arch() if gpu else None)
