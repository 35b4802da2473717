"""Re-run a (backend, case) under NVIDIA compute-sanitizer and keep what it found.

The runner writes the case as a reproducer bundle (difftest.records.bundle) and this module replays it in a
fresh process,

    compute-sanitizer --tool TOOL --error-exitcode 99 python -m difftest.cli replay BUNDLE

with PYTORCH_NO_CUDA_MEMORY_CACHING=1: with torch's caching allocator on, a read past the end of
a tensor usually lands inside a larger cached segment, which the sanitizer counts as valid memory.
The sanitizer's report lines (each starts with "========= ") are parsed into Findings, one per
distinct (message, kernel) with a count. Without CUDA or without the tool the report says why;
nothing here raises for the tool's absence or its failure.

The sanitizer and the replay under it die with the run, SIGKILL included: they run in a process
group of their own under difftest.core.lifetime's wrapper (`python -m difftest.core.lifetime --parent PID --
compute-sanitizer ...`), which kills the group when the run dies; this module kills it on a timeout
(or Ctrl-C here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from difftest.core import hardware
from difftest.core.kinds import SanitizerTool
from difftest.core.schema import MAX_COMMAND, MAX_ITEMS, Bool, Count, Int, Member, Record, Text, TupleOf

ERROR_EXITCODE = 99  # what the sanitizer exits with when it reported errors
TIMEOUT = 900.0  # seconds: replays under memcheck run tens of times slower than the kernel
# difftest.core.lifetime's wrapper, named rather than imported (that module sits above this one)
_GROUP_WRAPPER = ("-m", "difftest.core.lifetime", "--parent")
_PREFIX = "========="
_TAIL_LINES = 40
_DETAILS_KEPT = 4
_SKIPPED_HEADLINES = re.compile(r"^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|"
                                r"Target application returned an error)")


@dataclasses.dataclass(frozen=True)
class Finding(Record):
    """One kind of error the sanitizer reported: its message, where, and how often."""

    message: Text()  # e.g. "Invalid __global__ read of size 4 bytes"
    kernel: Text() | None  # from the report's "at ... in ..." line
    # reports with this message and kernel (memcheck reports every faulting thread)
    count: Int(1, (1 << 63) - 1)
    # the first report's thread, block and address lines
    details: TupleOf(Text(), 1024, "a list of at most 1024 strings")

    def describe(self) -> str:
        where = f" in {self.kernel}" if self.kernel else ""
        return f"{self.message}{where}" + (f" (x{self.count})" if self.count > 1 else "")


@dataclasses.dataclass(frozen=True)
class SanitizerReport(Record):
    """What one sanitizer run found, or why it did not run."""

    tool: Member(SanitizerTool)
    ran: Bool
    reason: Text() | None = None  # why it did not run or did not finish
    command: Text(MAX_COMMAND) | None = None
    exit_code: Int(-(1 << 31), (1 << 31) - 1) | None = None
    errors: Count | None = None  # the count of its ERROR SUMMARY line
    findings: TupleOf(Finding, MAX_ITEMS, "a list of sanitizer findings") = ()
    output_tail: Text() = ""

    def summary(self) -> str:
        """One line: the error count and the distinct findings, or why there are none."""
        if not self.ran:
            return f"{SanitizerTool(self.tool).value}: not run: {self.reason}"
        head = f"{SanitizerTool(self.tool).value}: {self.errors if self.errors is not None else '?'} errors"
        if self.reason:
            head += f" ({self.reason})"
        found = "; ".join(f.describe() for f in self.findings)
        return f"{head}: {found}" if found else head


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else under $CUDA_HOME/bin or /usr/local/cuda/bin."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        candidate = Path(root or "") / "bin" / "compute-sanitizer"
        if root and candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def unavailable_reason(device: str) -> str | None:
    """Why no sanitizer run is possible for a run on `device`, or None."""
    if device != "cuda":
        return f"compute-sanitizer checks CUDA kernels; this run is on {device}"
    if hardware.cuda_unavailable_reason():
        return hardware.CUDA_UNAVAILABLE
    if find_sanitizer() is None:
        return "compute-sanitizer not found on PATH, in $CUDA_HOME/bin or in /usr/local/cuda/bin"
    return None


def sanitizer_command(tool: SanitizerTool, bundle: str | Path, sanitizer: str = "compute-sanitizer",
                      python: str = sys.executable) -> list[str]:
    """The argv that replays `bundle` under `tool`. The bundle is the run's own, just written: its
    backend's module is trusted (--trust-bundle), as the run itself imported it. The kernel runs in the
    replaying process, the one the sanitizer watches (--no-isolate), whatever the run's isolation."""
    return [sanitizer, "--tool", SanitizerTool(tool).value, "--error-exitcode", str(ERROR_EXITCODE),
            python, "-m", "difftest.cli", "replay", str(bundle), "--trust-bundle", "--no-isolate"]


def sanitizer_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The replay's environment: caching off, and this interpreter's import path."""
    env = dict(os.environ if base is None else base)
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    # The replay must import what this process imported (a --backend-module under tests/, say).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def parse_output(text: str) -> tuple[int | None, tuple[Finding, ...]]:
    """(the ERROR SUMMARY count, the distinct findings) of a compute-sanitizer report."""
    errors = None
    reports: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if not line.startswith(_PREFIX):
            continue
        body = line[len(_PREFIX):]
        summary = re.match(r"\s*ERROR SUMMARY: (\d+) errors?", body)
        if summary:
            errors = int(summary.group(1))
        elif body.strip() and not body.startswith("  "):
            headline = body.strip()
            if not _SKIPPED_HEADLINES.match(headline):
                reports.append((headline, []))
        elif body.strip() and reports:
            reports[-1][1].append(body.strip())
    return errors, _grouped(reports)


def _grouped(reports: list[tuple[str, list[str]]]) -> tuple[Finding, ...]:
    """One Finding per (message, kernel), in order of first appearance."""
    found: dict[tuple[str, str | None], Finding] = {}
    for message, lines in reports:
        kernel = next((k for k in map(_kernel, lines) if k), None)
        key = (message, kernel)
        if key in found:
            found[key] = dataclasses.replace(found[key], count=found[key].count + 1)
            continue
        details = tuple(line for line in lines if not _is_backtrace(line) and _kernel(line) is None)
        found[key] = Finding(message, kernel, 1, details[:_DETAILS_KEPT])
    return tuple(found.values())


def _kernel(line: str) -> str | None:
    """The kernel of an 'at ...' line: 'at 0x1b0 in NAME' (older tools) or 'at NAME+0x1b0 in FILE:LINE'."""
    old = re.match(r"at 0x[0-9a-fA-F]+ in (.+)$", line)
    if old:
        return old.group(1).strip()
    new = re.match(r"at (.+?)\+0x[0-9a-fA-F]+ in (.+)$", line)
    if new:
        return f"{new.group(1).strip()} ({new.group(2).strip()})"
    return None


def _is_backtrace(line: str) -> bool:
    return line.startswith(("Host Frame", "Saved host backtrace", "Device Frame", "in /", "in lib"))


def replay_under(tool: SanitizerTool, bundle: Path, device: str) -> SanitizerReport:
    """Replay the bundle folder `bundle` under `tool` in a fresh process; the report never raises."""
    reason = unavailable_reason(device)
    if reason is not None:
        return SanitizerReport(tool=tool, ran=False, reason=reason)
    return run_sanitizer(tool, sanitizer_command(tool, bundle, find_sanitizer() or "compute-sanitizer"))


def run_sanitizer(tool: SanitizerTool, argv: list[str], timeout: float = TIMEOUT) -> SanitizerReport:
    """Run `argv` (sanitizer_command's) and parse its output; a timeout or a missing binary is a reason.
    `argv` and all it starts die with this process, or on a timeout (the module's docstring)."""
    command = shlex.join(argv)
    executable = shutil.which(argv[0])
    if executable is None:
        return SanitizerReport(tool, False, f"could not start: {argv[0]!r} is not an executable file", command)
    try:
        status, text = _output([sys.executable, *_GROUP_WRAPPER, str(os.getpid()), "--", executable, *argv[1:]],
                               timeout)
    except OSError as exc:
        return SanitizerReport(tool, False, f"could not start: {exc}", command)
    errors, findings = parse_output(text)
    if status is None:
        return SanitizerReport(tool, True, f"timed out after {timeout:g} s", command, None, errors, findings,
                               _tail(text))
    ended = None if errors is not None else f"no ERROR SUMMARY line (exit status {status})"
    return SanitizerReport(tool, True, ended, command, status, errors, findings, _tail(text))


def _output(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """`argv`'s exit status (None when it ran past `timeout` seconds) and its stdout then stderr, so
    far. It leads a process group of its own, killed whole unless `argv` ended by itself."""
    with subprocess.Popen(argv, env=sanitizer_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, errors="replace", start_new_session=True) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            return None, _text(exc.stdout) + _text(exc.stderr)
        finally:
            if child.returncode is None:  # a timeout, or Ctrl-C here: the leader is not reaped yet, its id still ours
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
        return child.returncode, out + err


def _text(value: str | bytes | None) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


def _tail(text: str) -> str:
    return "\n".join(text.splitlines()[-_TAIL_LINES:])
