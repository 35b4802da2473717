"""Hardware facts, asked in one place: is there a GPU (and if not, why), its arch, SMs, memory and
what one SM holds at once; on the CPU, what this process may still allocate (the host's available
memory, its cgroup's limit and its address-space limit, whichever is least).

Backends, the runner, the planner and the pytest markers all ask here, so a reason reads the same
wherever it is printed. torch is imported inside each function: the plugin and `difftest --help`
import this module without paying for torch.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CUDA_UNAVAILABLE = "torch.cuda.is_available() is False"
# Where the OS says what this process may allocate (tests point these at files of their own).
PROC_SELF = Path("/proc/self")
MEMINFO = Path("/proc/meminfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# A cgroup v1 memory.limit_in_bytes at or past this is "no limit" (the kernel writes 2^63 rounded down to pages).
CGROUP_V1_UNLIMITED = 1 << 62


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


def require_device(device: str, field: str = "device") -> None:
    """SpecError naming `field` unless work can run on `device` here: 'cpu' always, 'cuda' where torch
    sees a GPU. The one check of a device's availability, made where a request enters difftest."""
    if device == "cuda" and (reason := cuda_unavailable_reason()) is not None:
        from difftest.core.errors import SpecError  # deferred: errors imports nothing, kept so

        raise SpecError(field, device, f"a device torch can see ({reason})")


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


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """Bytes this process can still allocate on the host, and which limit says so."""

    bytes: int
    bound: str  # 'the host's available memory', 'the cgroup's memory limit' or 'RLIMIT_AS (ulimit -v)'


def host_memory() -> HostMemory | None:
    """What this process can still allocate on the host: the least of the host's available memory
    (MemAvailable), what its cgroup's limit leaves (v2 memory.max, v1 memory.limit_in_bytes, less the
    usage that is not reclaimable file cache, for its cgroup and every cgroup above it) and what its
    address-space limit leaves (RLIMIT_AS less the virtual memory already mapped). None where the OS
    says none of these. A container's free pages are the host's: only its cgroup says what it may use."""
    known = [(spare, bound) for spare, bound in ((_available(), "the host's available memory"),
                                                  (_cgroup_spare(), "the cgroup's memory limit"),
                                                  (_address_space_spare(), "RLIMIT_AS (ulimit -v)"))
             if spare is not None]
    if not known:
        return None
    spare, bound = min(known)
    return HostMemory(max(spare, 0), bound)


def _available() -> int | None:
    """MemAvailable of /proc/meminfo (free pages plus what the kernel can reclaim), else the free pages."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_spare() -> int | None:
    """The least that the memory limit of this process's cgroup, or of any cgroup above it, leaves."""
    spares = [limit - usage for limit, usage in _cgroup_limits()]
    return min(spares) if spares else None


def _cgroup_limits() -> Iterator[tuple[int, int]]:
    """(limit, usage less inactive file cache) of every limited memory cgroup from this process's up to
    the mount's root. /proc/self/cgroup gives each hierarchy's path (v2: '0::/path'; v1: 'N:memory:/path');
    inside a container with its own cgroup namespace that path is '/', the mount's root."""
    try:
        lines = (PROC_SELF / "cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, controllers, path = parts
        if controllers == "":
            files = (CGROUP_ROOT, "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            files = (CGROUP_ROOT / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        yield from _limits_up(*files, path)


def _limits_up(root: Path, limit_file: str, usage_file: str, inactive_key: str, path: str) -> Iterator[tuple[int, int]]:
    """(limit, usage) of `root`/`path` and each folder above it up to `root`, where a limit is set."""
    folder = root / path.strip("/")
    for here in (folder, *folder.parents):
        if here == root.parent:
            break
        limit = _read_int(here / limit_file)
        usage = _read_int(here / usage_file)
        if limit is None or usage is None or limit >= CGROUP_V1_UNLIMITED:
            continue
        yield limit, usage - _stat(here / "memory.stat", inactive_key)


def _read_int(path: Path) -> int | None:
    """The integer a cgroup file holds; None when it is absent, unreadable or 'max' (no limit)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _stat(path: Path, key: str) -> int:
    """A key's value in a cgroup's memory.stat, 0 when it is not there."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _address_space_spare() -> int | None:
    """RLIMIT_AS (ulimit -v) less this process's mapped virtual memory; None without a limit."""
    try:
        import resource  # deferred: POSIX only
    except ImportError:
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        mapped = int((PROC_SELF / "statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        mapped = 0
    return soft - mapped


def available_memory(device: str) -> int | None:
    """Bytes a new allocation can still take on `device` ('cuda': the current GPU; 'cpu': host_memory);
    None where the host does not say."""
    if device == "cuda":
        return free_memory()
    host = host_memory()
    return host.bytes if host else None


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
