"""compute-sanitizer replays: the command, the environment, the report parser (on canned output in
the tool's own format), the process handling, and a clear reason wherever it cannot run."""

from __future__ import annotations

import os
import stat
import sys
import textwrap

import pytest

from difftest.backends.torch_ref import TorchBackend
from difftest.backends.user import FunctionBackend
from difftest.cli import main
from difftest.config import RunConfig
from difftest.generators import build_case
from difftest.kinds import ExitStatus, SanitizerTool
from difftest.report import render_failures
from difftest.runner import run
from difftest.sanitize import (
    ERROR_EXITCODE,
    Finding,
    parse_output,
    run_sanitizer,
    sanitizer_command,
    sanitizer_environment,
    unavailable_reason,
)
from difftest.verdict import Verdict
from tests import broken_backends as bb
from tests.support import REPO_ROOT, TINY

MEMCHECK = textwrap.dedent("""\
    ========= COMPUTE-SANITIZER
    replay /tmp/b: broken on case [B=2]
    ========= Invalid __global__ read of size 4 bytes
    =========     at 0x1b0 in oob_kernel
    =========     by thread (31,0,0) in block (3,0,0)
    =========     Address 0x7f1a2c000400 is out of bounds
    =========     and is 4 bytes after the nearest allocation at 0x7f1a2c000000 of size 1024 bytes
    =========     Saved host backtrace up to driver entry point at kernel launch time
    =========         Host Frame: [0x2dfbef] in libcuda.so.1
    =========                in /lib/x86_64-linux-gnu/libcuda.so.1
    =========
    ========= Invalid __global__ read of size 4 bytes
    =========     at 0x1b0 in oob_kernel
    =========     by thread (30,0,0) in block (3,0,0)
    =========     Address 0x7f1a2c000404 is out of bounds
    =========
    ========= Invalid __global__ write of size 4 bytes
    =========     at huge_store_kernel+0x2a0 in /work/main/tests/gpu_broken_backends.py:88
    =========     by thread (0,0,0) in block (0,0,0)
    =========     Address 0x7f1a6c000000 is out of bounds
    =========
    ========= API_ERROR
    =========     Saved host backtrace up to driver entry point at error
    =========         Host Frame: [0x33e4a5] in libcuda.so.1
    =========
    ========= Target application returned an error
    ========= ERROR SUMMARY: 4 errors
    """).replace("API_ERROR", 'Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" '
                              "on CUDA API call to cuStreamSynchronize.")
RACECHECK = textwrap.dedent("""\
    ========= COMPUTE-SANITIZER
    ========= Error: Race reported between Write access at 0x3a0 in reduce_kernel
    =========     and Read access at 0x3c0 in reduce_kernel [128 hazards]
    =========
    ========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
    ========= ERROR SUMMARY: 1 error
    """)
INITCHECK_SYNCCHECK = textwrap.dedent("""\
    ========= Uninitialized __global__ memory read of size 4 bytes
    =========     at 0x90 in sum_kernel
    =========     by thread (0,0,0) in block (0,0,0)
    =========
    ========= Barrier error detected. Divergent thread(s) in warp
    =========     at 0x120 in barrier_kernel
    =========     by thread (1,0,0) in block (0,0,0)
    =========
    ========= ERROR SUMMARY: 2 errors
    """)


# --------------------------------------------------------------------------- parsing

def test_memcheck_report_is_grouped_per_message_and_kernel():
    errors, findings = parse_output(MEMCHECK)
    assert errors == 4
    assert findings == (
        Finding("Invalid __global__ read of size 4 bytes", "oob_kernel", 2,
                ("by thread (31,0,0) in block (3,0,0)", "Address 0x7f1a2c000400 is out of bounds",
                 "and is 4 bytes after the nearest allocation at 0x7f1a2c000000 of size 1024 bytes")),
        Finding("Invalid __global__ write of size 4 bytes",
                "huge_store_kernel (/work/main/tests/gpu_broken_backends.py:88)", 1,
                ("by thread (0,0,0) in block (0,0,0)", "Address 0x7f1a6c000000 is out of bounds")),
        Finding('Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API '
                "call to cuStreamSynchronize.", None, 1, ()),
    ), f"{findings=}"


def test_racecheck_initcheck_and_synccheck_reports():
    errors, findings = parse_output(RACECHECK)
    assert errors == 1 and [(f.message, f.kernel) for f in findings] == [
        ("Error: Race reported between Write access at 0x3a0 in reduce_kernel", None)], f"{findings=}"
    assert findings[0].details == ("and Read access at 0x3c0 in reduce_kernel [128 hazards]",)
    errors, findings = parse_output(INITCHECK_SYNCCHECK)
    assert errors == 2 and [(f.message, f.kernel) for f in findings] == [
        ("Uninitialized __global__ memory read of size 4 bytes", "sum_kernel"),
        ("Barrier error detected. Divergent thread(s) in warp", "barrier_kernel")], f"{findings=}"


def test_clean_and_foreign_output():
    assert parse_output("========= COMPUTE-SANITIZER\nPASS\n========= ERROR SUMMARY: 0 errors\n") == (0, ())
    assert parse_output("Traceback (most recent call last):\nRuntimeError: boom\n") == (None, ())


# --------------------------------------------------------------------------- the command

def test_command_and_environment():
    argv = sanitizer_command("racecheck", "/tmp/bundle dir", "/opt/cuda/bin/compute-sanitizer", "/usr/bin/python3")
    assert argv == ["/opt/cuda/bin/compute-sanitizer", "--tool", "racecheck", "--error-exitcode", "99",
                    "/usr/bin/python3", "-m", "difftest.cli", "replay", "/tmp/bundle dir", "--trust-bundle"]
    env = sanitizer_environment({"PATH": "/bin", "PYTORCH_NO_CUDA_MEMORY_CACHING": "0"})
    assert env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1" and env["PATH"] == "/bin"
    assert str(REPO_ROOT) in env["PYTHONPATH"].split(os.pathsep), "the replay imports what this process can"
    with pytest.raises(ValueError, match="'valgrind'"):
        sanitizer_command("valgrind", "/tmp/b")


def _tool(tmp_path, body: str) -> str:
    """An executable standing in for the sanitizer binary: only the process handling is under test."""
    path = tmp_path / "tool.sh"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_run_sanitizer_parses_exit_status_and_output(tmp_path):
    (tmp_path / "out.txt").write_text(MEMCHECK)
    env_file = tmp_path / "env.txt"
    tool = _tool(tmp_path, f'echo "$PYTORCH_NO_CUDA_MEMORY_CACHING" > {env_file}; cat {tmp_path / "out.txt"}; '
                           f"exit {ERROR_EXITCODE}")
    report = run_sanitizer("memcheck", [tool, "--tool", "memcheck"])
    assert (report.ran, report.exit_code, report.errors, len(report.findings)) == (True, 99, 4, 3), f"{report=}"
    assert report.reason is None and report.command.endswith("tool.sh --tool memcheck")
    assert env_file.read_text().strip() == "1"
    assert report.summary().startswith("memcheck: 4 errors: Invalid __global__ read of size 4 bytes in oob_kernel (x2)")


def test_run_sanitizer_reasons_instead_of_raising(tmp_path):
    missing = run_sanitizer("memcheck", [str(tmp_path / "no-such-tool")])
    assert not missing.ran and missing.reason.startswith("could not start"), f"{missing=}"
    slow = run_sanitizer("memcheck", [_tool(tmp_path, "echo '========= Invalid __global__ read of size 1 bytes'; "
                                                      "exec sleep 30")], timeout=0.5)
    assert slow.ran and slow.reason == "timed out after 0.5 s" and slow.findings[0].count == 1, f"{slow=}"
    silent = run_sanitizer("memcheck", [sys.executable, "-c", "raise SystemExit(3)"])
    assert silent.reason == "no ERROR SUMMARY line (exit status 3)" and silent.errors is None, f"{silent=}"


# --------------------------------------------------------------------------- in a run

def test_cpu_run_records_why_no_sanitizer_ran():
    assert unavailable_reason("cpu") == "compute-sanitizer checks CUDA kernels; this run is on cpu"
    case = build_case(TINY.replace(next_n=2), 0)
    backends = [TorchBackend(), FunctionBackend.from_function(bb.reads_past_table)]
    failing = run(backends, [case], RunConfig(sanitize=SanitizerTool.MEMCHECK))
    assert [r.sanitizer is None for r in failing] == [True, False], f"{failing=}"
    report = failing[1].sanitizer
    assert not report.ran and report.reason == unavailable_reason("cpu") and failing[1].verdict == Verdict.FAIL_NAN
    assert "memcheck: not run: compute-sanitizer checks CUDA kernels" in render_failures(failing)
    every = run(backends, [case], RunConfig(sanitize=SanitizerTool.INITCHECK, sanitize_all=True))
    assert all(r.sanitizer is not None and r.sanitizer.tool == "initcheck" for r in every)
    assert [r.verdict for r in every] == [Verdict.PASS, Verdict.FAIL_NAN], "no findings, no new verdict"


def test_cli_sanitize_options(capsys):
    argv = ["run", "--backends", "torch", "--backend-module", "tests.broken_backends:raises", "--cases", "edges",
            "--case-filter", "length-one-*", "--no-progress"]
    assert main([*argv, "--sanitize", "memcheck"]) == ExitStatus.FAILED
    assert "memcheck: not run: compute-sanitizer checks CUDA kernels; this run is on cpu" in capsys.readouterr().out
    for bad, field in ((["--sanitize", "valgrind"], "--sanitize="), (["--sanitize-all"], "--sanitize-all=")):
        assert main([*argv, *bad]) == ExitStatus.USAGE
        err = capsys.readouterr().err
        assert err.startswith(f"difftest: error: {field}") and err.count("\n") == 1, err
