"""Hostile memory limits (issue 29's red-team pass): a container's cgroup, an address-space limit, and a
case that cannot be drawn. Each must end with a message or a report and the numbers, never with the
kernel's OOM killer, a traceback or stale locks; and a correct kernel never gets a verdict from memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from difftest.core import hardware
from difftest.core.errors import SpecError
from difftest.core.kinds import Device
from difftest.engine.plan import PlannedCase, SuiteRequest
from difftest.generators.envelope import Target, estimate_bytes
from difftest.generators.spec import CaseSpec, LengthDist
from difftest.workflows.session import RunRequest, execute
from tests.support import REPO_ROOT

GIB = 1 << 30
# The red-team's case: valid, estimated at 6.7 GiB on the CPU.
LARGE = CaseSpec(name="large", batch=76, next_n=2, heads=64, head_dim=128, block_size=64, max_model_len=65536,
                 length_dist=LengthDist.FULL)


def _container(monkeypatch, tmp_path, limit: int, used: int) -> None:
    """This process in a cgroup v2 of `limit` bytes with `used` in use, on a host with 64 GiB available."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/\n")
    (proc / "statm").write_text("1 1\n")
    (tmp_path / "meminfo").write_text(f"MemAvailable: {64 << 20} kB\n")
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "memory.max").write_text(f"{limit}\n")
    (root / "memory.current").write_text(f"{used}\n")
    monkeypatch.setattr(hardware, "PROC_SELF", proc)
    monkeypatch.setattr(hardware, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(hardware, "CGROUP_ROOT", root)


def test_a_case_too_large_for_the_containers_cgroup_is_refused_with_the_numbers(monkeypatch, tmp_path):
    """In a 3 GiB container a 6.7 GiB case was OOM-killed (no message, no report, stale locks): the host's
    free pages said it fit. The cgroup's limit is what this process may use."""
    assert 6.5 * GIB < estimate_bytes(LARGE).total(Device.CPU) < 7 * GIB
    _container(monkeypatch, tmp_path, limit=3 * GIB, used=GIB)
    assert Target.probe(Device.CPU).memory_bytes == int(2 * GIB * 0.85)
    report = tmp_path / "r.json"
    with pytest.raises(SpecError) as info:
        execute(RunRequest(suite=SuiteRequest(spec=LARGE), backends=("torch",), report=report))
    assert info.value.field == "spec" and "1.7 GiB this cpu can spare; it needs 6." in info.value.expected
    assert "the cgroup's memory limit bounds it" in info.value.expected, info.value
    assert not report.exists() and not list(tmp_path.glob("*.lock")), "refused before anything was claimed"


def test_the_envelope_plan_in_a_small_container_leaves_out_what_does_not_fit_and_says_why(monkeypatch, tmp_path):
    _container(monkeypatch, tmp_path, limit=GIB, used=GIB - 400 * 10**6)  # 340 MB to plan with
    report = tmp_path / "r.json"
    outcome = execute(RunRequest(suite=SuiteRequest(case_filter=("h*",)), backends=("torch",), report=report))
    omitted = dict(outcome.plan.omitted["torch"])
    assert "high-block-ids-65536 needs 680.0 MB" in omitted["high-block-ids"], omitted
    assert "340.0 MB allowed" in omitted["high-block-ids"], omitted
    assert [r.case for r in outcome.results] == ["heavy-tailed-values-s10000"], outcome.results
    assert json.loads(report.read_text())["run"]["plan"]["omitted"]["torch"], "the report says so too"


def test_a_case_that_runs_out_of_memory_being_drawn_is_a_skip_with_the_numbers_and_the_run_goes_on(monkeypatch,
                                                                                                   tmp_path):
    """Drawing a case under `ulimit -v` was a traceback. torch's CPU allocator says 'can't allocate memory'."""
    build = PlannedCase.build

    def drawn(self, device, validate=True):
        if self.name.startswith("heavy"):
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                               "memory: you tried to allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)")
        return build(self, device, validate)

    monkeypatch.setattr(PlannedCase, "build", drawn)
    report = tmp_path / "r.json"
    outcome = execute(RunRequest(suite=SuiteRequest(case_filter=("heavy*", "length-one*")), backends=("torch",),
                                 report=report))
    by_case = {r.case: r for r in outcome.results}
    skipped = by_case["heavy-tailed-values-s10000"]
    assert skipped.verdict.value == "SKIP" and by_case["length-one-s1000"].verdict.value == "PASS", outcome.results
    assert skipped.reason.startswith("not drawn: drawing the case ran out of memory (RuntimeError: [enforce fail"), \
        skipped.reason
    assert "it needs about" in skipped.reason and "free on cpu (" in skipped.reason, skipped.reason
    assert {r["case"] for r in json.loads(report.read_text())["results"]} == set(by_case)


# Run in a child: import everything, then limit the address space to what is mapped now plus LIMIT_SPARE (the
# virtual memory the rest of the run may map), then `difftest run`.
LIMIT_SPARE = 600 << 20
UNDER_ULIMIT = """
import resource, sys
from difftest.cli import main
import difftest.workflows.session, difftest.engine.runner, difftest.oracles.reference
mapped = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + int(sys.argv[1]), resource.RLIM_INFINITY))
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm (Linux)")
def test_difftest_run_under_ulimit_v_ends_with_a_report_and_the_case_left_out_with_the_numbers(tmp_path):
    """Under an address-space limit the planner plans with what the limit leaves: the 680 MB case of the
    plan is left out with its numbers, the rest runs, the report is written, and nothing is killed."""
    report = tmp_path / "r.json"
    argv = ["run", "--backends", "torch", "--case-filter", "h*", "--no-progress", "--report", str(report)]
    done = subprocess.run([sys.executable, "-c", UNDER_ULIMIT, str(LIMIT_SPARE), *argv], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "torch: high-block-ids left out: high-block-ids-65536 needs 680.0 MB" in done.stdout, done.stdout
    results = json.loads(report.read_text())["results"]
    assert [(r["case"], r["verdict"]) for r in results] == [("heavy-tailed-values-s10000", "PASS")], results
