"""compute-sanitizer replays: the command, the environment, the report parser (on canned output in
the tool's own format), the process handling (a timeout, a SIGKILLed run: nothing left running), and
a clear reason wherever it cannot run."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from difftest.backends import Origin
from difftest.backends.torch_ref import TorchBackend
from difftest.backends.user import FunctionBackend
from difftest.cli import main
from difftest.core.kinds import ExitStatus, SanitizerTool
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.sanitize import (
    ERROR_EXITCODE,
    Finding,
    find_sanitizer,
    parse_output,
    run_sanitizer,
    sanitizer_command,
    sanitizer_environment,
    unavailable_reason,
)
from difftest.generators import build_case
from difftest.records.bundle import write_bundle
from difftest.records.report import render_failures
from difftest.workflows.running import run, run_one
from tests import broken_backends as bb
from tests.difftest.test_hardening import _descendants, _running, _wait_for
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
                    "/usr/bin/python3", "-m", "difftest.cli", "replay", "/tmp/bundle dir", "--trust-bundle",
                    "--no-isolate"]
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
    silent = run_sanitizer("memcheck", [sys.executable, "-c", "raise SystemExit(3)"])
    assert silent.reason == "no ERROR SUMMARY line (exit status 3)" and silent.errors is None, f"{silent=}"


# --------------------------------------------------------------------------- nothing left running

# A stand-in for compute-sanitizer on a machine without a GPU: `TOOL --tool T --error-exitcode N
# PROGRAM...` starts PROGRAM through a launcher process of its own (the real tool's
# TreeLauncherSubreaper), which outlives the tool when the tool is killed, so no chain of dying parents
# reaches PROGRAM; no process of it asks to die with its parent, and all three stay in one process
# group: only the killing of that group ends them.
STAND_IN = """#!{python}
import os, subprocess, sys
open({pid_file!r}, "w").write(str(os.getpid()))
launcher = os.fork()
if launcher == 0:
    os._exit(subprocess.call(sys.argv[5:]))
sys.exit(os.waitstatus_to_exitcode(os.waitpid(launcher, 0)[1]))
"""
# A bundle's backend that says where it runs, then never returns: the replay, busy in a kernel.
HANGING_BACKEND = """
import os, time
from difftest.backends.user import backend
from tests.broken_backends import CONTRACT

@backend(contract=CONTRACT, name="writes-pid-and-hangs")
def writes_pid_and_hangs(q, kv_cache, weights, context_lens, block_table, max_model_len):
    open({pid_file!r}, "w").write(str(os.getpid()))
    time.sleep(3600)
"""
# A run's sanitizer step in a process of its own: run_sanitizer on bundle argv[2] with the tool argv[3].
SANITIZING_RUN = ("import sys\n"
                  "sys.path.insert(0, sys.argv[1])  # the bundle's backend module; the replay gets this path\n"
                  "from difftest.engine.sanitize import run_sanitizer, sanitizer_command\n"
                  "run_sanitizer('memcheck', sanitizer_command('memcheck', sys.argv[2], sys.argv[3]))\n")
NO_SANITIZER = "needs compute-sanitizer: not on PATH, in $CUDA_HOME/bin or in /usr/local/cuda/bin"
NO_GPU = "needs a CUDA GPU: torch.cuda.is_available() is False"


def _stand_in(tmp_path: Path) -> str:
    path = tmp_path / "compute-sanitizer"
    path.write_text(STAND_IN.format(python=sys.executable, pid_file=str(tmp_path / "sanitizer.pid")))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _pid(path: Path) -> int | None:
    text = path.read_text() if path.exists() else ""
    return int(text) if text else None


def _command_lines(pids: set[int]) -> dict[int, bytes]:
    """The command lines of those of `pids` that run, from /proc."""
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()[:200]
    return {pid: line for pid, line in found.items() if _running(pid)}


def _left_after(pids: set[int], seconds: float = 30) -> dict[int, bytes]:
    """Those of `pids` still running after up to `seconds`, with their command lines."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.05)
    return _command_lines(pids)


def _kill_sanitizing_run(tmp_path: Path, sanitizer: str,
                         device: str) -> tuple[dict[int, bytes], int, dict[int, bytes]]:
    """SIGKILL a process running the sanitizer step (SANITIZING_RUN) on a `device` bundle of HANGING_BACKEND
    once that backend runs under `sanitizer`: (every process below it then, with its command line, the
    replay's pid, those still running 30 s after the kill). Whatever is left is killed before this returns."""
    replay_pid = tmp_path / "replay.pid"
    (tmp_path / "hanging_backend.py").write_text(HANGING_BACKEND.format(pid_file=str(replay_pid)))
    case = build_case(TINY, 0)
    recorded = dataclasses.replace(run_one(TorchBackend(), case, RunConfig()), backend="writes-pid-and-hangs")
    bundle = write_bundle(tmp_path / "bundles", case, recorded, RunConfig(device=device),
                          Origin("hanging_backend:writes_pid_and_hangs", registered=False))
    run_step = subprocess.Popen([sys.executable, "-c", SANITIZING_RUN, str(tmp_path), str(bundle), sanitizer],
                                cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    below: dict[int, bytes] = {}
    try:
        _wait_for(lambda: _pid(replay_pid) is not None, run_step, seconds=300)
        below = _command_lines(_descendants(run_step.pid))
        run_step.kill()
        run_step.wait(30)
        left = _left_after(set(below))
    finally:
        run_step.kill()
        for pid in below:
            if _running(pid):
                os.kill(pid, 9)
    return below, _pid(replay_pid), left


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to follow the processes")
def test_a_timeout_kills_the_sanitizer_and_the_program_it_started(tmp_path):
    program_pid = tmp_path / "program.pid"
    program = (f"import os, time\nopen({str(program_pid)!r}, 'w').write(str(os.getpid()))\n"
               "print('========= Invalid __global__ read of size 1 bytes', flush=True)\ntime.sleep(3600)\n")
    argv = [_stand_in(tmp_path), "--tool", "memcheck", "--error-exitcode", "99", sys.executable, "-c", program]
    report = run_sanitizer("memcheck", argv, timeout=5)
    assert report.ran and report.reason == "timed out after 5 s" and report.exit_code is None, f"{report=}"
    assert [f.count for f in report.findings] == [1], f"what the program printed before the timeout: {report=}"
    pids = {_pid(tmp_path / "sanitizer.pid"), _pid(program_pid)}
    assert None not in pids, f"both started within the timeout: {pids=}"
    left = _left_after(pids)  # the program asked for nothing: only the group's kill ends it
    assert not left, f"left running after the timeout: {left}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sigkilled_run_takes_its_sanitizer_and_the_replay_under_it_along(tmp_path):
    below, replay, left = _kill_sanitizing_run(tmp_path, _stand_in(tmp_path), "cpu")
    sanitizer = _pid(tmp_path / "sanitizer.pid")
    assert {sanitizer, replay} <= below.keys(), f"both ran below the run: {below=} {sanitizer=} {replay=}"
    assert not left, f"left running after the run was SIGKILLed: {left}"


@pytest.mark.gpu
@pytest.mark.skipif(find_sanitizer() is None, reason=NO_SANITIZER)
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)  # the nearest: its reason first
def test_a_sigkilled_run_takes_the_real_compute_sanitizer_and_its_cuda_replay_along(tmp_path):
    below, replay, left = _kill_sanitizing_run(tmp_path, find_sanitizer(), "cuda")
    tools = [pid for pid, line in below.items() if line.split(b"\0")[0].endswith(b"compute-sanitizer")]
    assert tools and replay in below, f"the sanitizer and the replay ran below the run: {below=} {replay=}"
    assert not left, f"left running after the run was SIGKILLed: {left}"


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
