"""difftest.core.memory and the host's memory in difftest.core.hardware: one model for the planner, fuzz
batching and the side-by-side rule; what this process may allocate under a cgroup or an RLIMIT_AS."""

from __future__ import annotations

import dataclasses
import resource
from pathlib import Path

import pytest
import torch

from difftest.backends import load_backend
from difftest.core import hardware, memory
from difftest.core.kinds import Device, Fp8Flavour
from difftest.core.memory import Shape, SideBySide, call_bytes, is_out_of_memory
from difftest.generators.cases import default_specs, edge_cases
from difftest.generators.envelope import estimate_bytes, spec_shape
from difftest.generators.tensors import build_case
from tests.support import TINY

GIB = 1 << 30


# --------------------------------------------------------------------------- one call's bytes

def test_a_call_holds_its_inputs_its_logits_and_the_working_memory_it_declares():
    """The side-by-side rule (SIDE_BY_SIDE_MEMORY) adds these up over a case's backends: AITER's stage1
    holds H times the logits besides, which the fused kernels do not."""
    case = build_case(TINY.replace(heads=32, head_dim=32), 0)
    logits = case.rows * case.max_model_len
    fused, stage1 = (load_backend(name).contract for name in ("aiter-triton-fused", "aiter-triton-stage1"))
    shape = Shape.of_case(case)
    inputs = case.pool_bytes + case.q.numel() + case.weights.numel() * 4 + case.block_table.numel() * 4 + case.batch * 8
    for contract in (fused, stage1):
        repaged = case.block_table.numel() * case.block_size * 8 if contract.block_size_for(4) != 4 else 0
        working = 4 * 32 * logits if contract is stage1 else 0
        assert call_bytes(shape, contract) == (inputs + repaged, logits * 4, working), contract


def test_a_specs_call_bytes_bound_those_of_every_case_it_draws():
    """estimate_bytes (the planner) and Shape.of_case (the runner's side-by-side rule) share call_bytes:
    a spec's upper bounds stay above what any case it draws holds, for a backend that re-pages the cache
    and one that converts it to e4m3fnuz too."""
    repaging = load_backend("aiter-triton-stage1").contract
    converting = dataclasses.replace(repaging, fp8=Fp8Flavour.E4M3FNUZ)
    for spec in [*edge_cases(), *default_specs()]:
        for contract in (None, repaging, converting):
            bound = estimate_bytes(spec, contract)
            for seed in range(2):
                held = call_bytes(Shape.of_case(build_case(spec, seed)), contract)
                assert held.kernel <= bound.kernel_bytes and held.logits == bound.logits_bytes, spec.name
                assert held.working <= bound.working_bytes, spec.name


def test_a_built_case_and_its_spec_have_the_same_shape_where_the_spec_fixes_it():
    spec = TINY.replace(lengths=(9, 0, 17), next_n=2, extra_columns=1)
    case = build_case(spec, 0)
    assert Shape.of_case(case) == spec_shape(spec), "fixed lengths: the bound is the case itself"
    assert estimate_bytes(spec).key_reads == Shape.of_case(case).key_reads == 8 + 9 + 0 + 0 + 16 + 17


# --------------------------------------------------------------------------- the side-by-side rule

SHAPE = Shape(batch=4, next_n=2, heads=64, head_dim=128, block_size=64, max_model_len=1 << 20, width=1 << 14,
              blocks=1024, drawn_blocks=1024, longest=1 << 20, key_reads=0)


def test_calls_run_side_by_side_while_they_fit_a_share_of_the_free_memory():
    rule = SideBySide()
    one = rule.counted("a", SHAPE, None)
    assert one == call_bytes(SHAPE, None).total
    assert rule.together([one] * 3, free=int(3 * one / memory.SIDE_BY_SIDE_MEMORY))
    assert not rule.together([one] * 3, free=int(3 * one / memory.SIDE_BY_SIDE_MEMORY) - 100)
    assert rule.together([one] * 3, free=None), "not knowing the free memory is no reason to serialise"


def test_after_a_call_ran_out_beside_others_cases_as_large_run_one_at_a_time():
    rule = SideBySide()
    rule.ran_out(10 * GIB)
    assert not rule.together([5 * GIB, 5 * GIB], free=1 << 50), "as large: one at a time"
    assert rule.together([4 * GIB, 5 * GIB], free=1 << 50), "smaller cases still run side by side"
    rule.ran_out(20 * GIB)
    assert rule.alone_from == 10 * GIB, "what it learned stays the smallest size that ran out"


def test_a_measured_call_counts_what_it_allocated_where_the_contract_declares_less():
    rule = SideBySide()
    declared = call_bytes(SHAPE, None)
    rule.measured("hungry", peak_bytes=12 * SHAPE.logits, logits=SHAPE.logits)  # 12 bytes a logit, not 4
    assert rule.counted("hungry", SHAPE, None) == declared.kernel + 12 * SHAPE.logits
    assert rule.counted("other", SHAPE, None) == declared.total, "what one backend allocates is its own"
    rule.measured("hungry", peak_bytes=SHAPE.logits, logits=SHAPE.logits)
    assert rule.counted("hungry", SHAPE, None) == declared.kernel + 12 * SHAPE.logits, "the most it took stays"


# --------------------------------------------------------------------------- running out

@pytest.mark.parametrize("error_type, text, out", [
    ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 8.00 GiB.", True),
    ("RuntimeError", "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried", True),
    ("RuntimeError", "CUDA error: out of memory", True),
    ("RuntimeError", "CUDA driver error: CUDA_ERROR_OUT_OF_MEMORY", True),
    ("RuntimeError", "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)", True),
    ("_ArrayMemoryError", "Unable to allocate 1.00 PiB for an array", True),
    ("OutOfResources", "out of resource: shared memory, Required: 262144, Hardware limit: 232448", False),
    ("RuntimeError", "kernel exploded at launch", False),
    (None, None, False),
])
def test_what_counts_as_running_out_of_memory(error_type, text, out):
    assert is_out_of_memory(error_type, text) is out


def test_torchs_own_cpu_allocation_failure_counts():
    with pytest.raises(RuntimeError) as info:
        torch.empty(1 << 62, dtype=torch.uint8)
    assert memory.ran_out(info.value), str(info.value)


# --------------------------------------------------------------------------- the host's memory

def _host(monkeypatch, tmp_path: Path, cgroup: str, files: dict[str, str], meminfo_kib: int = 64 << 20) -> Path:
    """/proc/self/cgroup, /proc/meminfo and a cgroup tree of `files`, all under tmp_path."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "statm").write_text("262144 1000 0 0 0 0 0\n")  # 1 GiB mapped at 4 KiB pages
    (tmp_path / "meminfo").write_text(f"MemTotal: {2 * meminfo_kib} kB\nMemAvailable: {meminfo_kib} kB\n")
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(hardware, "PROC_SELF", proc)
    monkeypatch.setattr(hardware, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(hardware, "CGROUP_ROOT", root)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    return root


def test_without_limits_the_host_memory_is_what_meminfo_says_is_available(monkeypatch, tmp_path):
    _host(monkeypatch, tmp_path, "0::/\n", {})
    assert hardware.host_memory() == hardware.HostMemory(64 * GIB, "the host's available memory")


def test_a_cgroup_v2_limit_leaves_its_memory_max_less_what_is_used(monkeypatch, tmp_path):
    """The red-team case: a 3 GiB container on a host with 64 GiB free. Reclaimable file cache is not use."""
    _host(monkeypatch, tmp_path, "0::/job/step\n", {
        "memory.max": "max\n", "memory.current": str(40 * GIB),  # the root: no limit
        "job/memory.max": str(3 * GIB), "job/memory.current": str(GIB),
        "job/memory.stat": f"anon {GIB // 2}\ninactive_file {GIB // 2}\n",
        "job/step/memory.max": "max\n", "job/step/memory.current": str(GIB)})
    assert hardware.host_memory() == hardware.HostMemory(3 * GIB - GIB // 2, "the cgroup's memory limit")
    assert memory.usable(Device.CPU) == int((3 * GIB - GIB // 2) * memory.MEMORY_HEADROOM)


def test_a_cgroup_namespace_reads_its_own_limit_at_the_mount_root(monkeypatch, tmp_path):
    _host(monkeypatch, tmp_path, "0::/\n", {"memory.max": str(3 * GIB), "memory.current": str(GIB)})
    assert hardware.host_memory().bytes == 2 * GIB


def test_a_cgroup_v1_limit_counts_and_its_unlimited_value_does_not(monkeypatch, tmp_path):
    files = {"memory/docker/abc/memory.limit_in_bytes": str(4 * GIB),
             "memory/docker/abc/memory.usage_in_bytes": str(3 * GIB),
             "memory/docker/abc/memory.stat": f"cache {GIB}\ntotal_inactive_file {GIB}\n",
             "memory/memory.limit_in_bytes": "9223372036854771712", "memory/memory.usage_in_bytes": str(GIB)}
    _host(monkeypatch, tmp_path, "12:memory:/docker/abc\n11:pids:/docker/abc\n0::/\n", files)
    assert hardware.host_memory() == hardware.HostMemory(2 * GIB, "the cgroup's memory limit")


def test_rlimit_as_leaves_its_limit_less_what_is_mapped(monkeypatch, tmp_path):
    _host(monkeypatch, tmp_path, "0::/\n", {})
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (3 * GIB, 3 * GIB) if which == resource.RLIMIT_AS else (-1, -1))
    assert hardware.host_memory() == hardware.HostMemory(2 * GIB, "RLIMIT_AS (ulimit -v)")  # 3 GiB less 1 mapped


def test_nothing_readable_leaves_the_planners_default(monkeypatch, tmp_path):
    monkeypatch.setattr(hardware, "host_memory", lambda: None)
    assert memory.usable(Device.CPU) == memory.SMALL_MEMORY
