"""What a run leaves behind when it is killed: child processes that die with it, temporary folders
that the next run sweeps away.

A child process (an isolated worker, a shard of a spread run) asks the kernel to SIGKILL it when its
parent dies (die_with_parent: prctl(PR_SET_PDEATHSIG) on Linux), so a SIGKILLed run leaves no process
running a kernel nobody waits for. PR_SET_PDEATHSIG is set by the child itself, after exec, rather
than in a preexec_fn: the parent has torch's threads, and Python documents preexec_fn as unsafe in a
threaded process.

A program that cannot ask, and whose children do not either, runs under this module's wrapper,
`python -m difftest.core.lifetime --parent PID -- ARGV...` (main, run_as_group): compute-sanitizer starts
its target through a helper of its own (TreeLauncherSubreaper) that outlives it, SIGKILL or SIGTERM,
so no chain of parents reaches the replay under it. The wrapper leads a process group, runs ARGV in
it and asks for SIGTERM when its parent dies, on which it SIGKILLs the whole group: ARGV and all it
started, at any depth, as long as none left the group (compute-sanitizer's tree does not).

Temporary folders live in one folder per process, `difftest-run-<pid>-*` in the system's temp
folder, whose `owner` file records the pid and that process's start time (so a reused pid is not
taken for the run). A clean exit removes it (atexit); a SIGKILL cannot, so every run first sweeps the
folders whose owner no longer runs (sweep). The isolated path's reaper removes its own at once.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from difftest.core.files import pid_alive

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
ORPHANED = 1  # exit status of a child whose run (its parent) was gone before it could ask
CANNOT_RUN = 127  # the wrapper's exit status when ARGV cannot be run, as a shell's
PREFIX = "difftest-run-"
OWNER = "owner"  # in a run folder: "<pid> <start time>"
_folder: Path | None = None  # this process's run folder, once made


def die_with_parent(run_pid: int | None) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux; elsewhere nothing), and exit
    at once if the run `run_pid` (the parent, or the parent's parent for a fork server's child) is
    already gone: it died before the request, so no signal comes."""
    _ask_for_signal_with_parent(signal.SIGKILL)
    if run_pid is not None and not pid_alive(run_pid):
        os._exit(ORPHANED)


def _ask_for_signal_with_parent(signum: int) -> None:
    """prctl(PR_SET_PDEATHSIG, signum) on Linux; nothing elsewhere (no prctl: the child outlives a
    killed parent until its work ends)."""
    _prctl(_PR_SET_PDEATHSIG, signum)


def run_as_group(parent: int, argv: Sequence[str]) -> int:
    """Run `argv` (searching PATH) in this process's own process group and SIGKILL the whole group,
    this process included, when `parent`, this process's parent, dies. Returns `argv`'s exit status
    (128 + N when signal N ended it, as a shell says), ORPHANED at once if `parent` is gone already
    (this process was handed to another), CANNOT_RUN with a line on stderr if `argv` cannot be run."""
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, _kill_own_group)
    _ask_for_signal_with_parent(signal.SIGTERM)  # catchable, unlike SIGKILL: the handler takes the group along
    if os.getppid() != parent:
        return ORPHANED
    try:
        child = subprocess.Popen(list(argv))
    except OSError as exc:
        print(f"difftest.core.lifetime: cannot run {argv[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return CANNOT_RUN
    status = child.wait()
    return status if status >= 0 else 128 - status


def _kill_own_group(signum: int, frame: FrameType | None) -> None:
    """run_as_group's SIGTERM handler: SIGKILL its process group, itself included."""
    os.killpg(os.getpid(), signal.SIGKILL)


def _started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22); None without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[19]


def _owner_alive(folder: Path) -> bool:
    """Whether the process that made run folder `folder` still runs (True when its owner file is not
    written yet: it is being made right now)."""
    try:
        pid_text, _, started = (folder / OWNER).read_text().partition(" ")
    except OSError:
        return True
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    return pid_alive(pid) and (started.strip() in ("", "None") or started.strip() == _started(pid))


def sweep(root: Path | None = None) -> list[Path]:
    """Remove the run folders in `root` (default: the temp folder) whose owner no longer runs, a run
    killed with SIGKILL; the folders removed."""
    root = Path(root or tempfile.gettempdir())
    try:
        folders = [p for p in root.iterdir() if p.name.startswith(PREFIX) and p.is_dir()]
    except OSError:
        return []
    dead = [folder for folder in folders if folder != _folder and not _owner_alive(folder)]
    for folder in dead:
        shutil.rmtree(folder, ignore_errors=True)
    return dead


def run_folder() -> Path:
    """This process's run folder, made (after a sweep) the first time it is asked for."""
    global _folder
    if _folder is None or not _folder.is_dir():
        sweep()
        folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        # Written aside and renamed into place: a sweep in another process that read the owner file half
        # written (empty) would take the folder for a dead run's and remove it under this one.
        partial = folder / f".{OWNER}"
        partial.write_text(f"{os.getpid()} {_started(os.getpid())}\n")
        os.replace(partial, folder / OWNER)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _folder = folder
    return _folder


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary folder in this process's run folder, removed when the block ends."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=run_folder()) as folder:
        yield Path(folder)


# --------------------------------------------------------------------------- the supervised command

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD)
LEFTOVER_SECONDS = 1.0  # how long what a command left running gets to end by itself before it is killed


@dataclasses.dataclass(frozen=True)
class Ended:
    """How a supervised command's process ended: its exit status or the signal that killed it, whether
    the command had returned (or raised) by then (False when something in the process ended it first:
    os._exit(), a C exit(), an exec(), a signal), and whether that signal was one sent to the command
    (a kill passed on, a Ctrl-C or hang-up from the terminal) rather than one the process met itself."""

    status: int | None
    signum: int | None
    finished: bool
    sent: bool = False

    @property
    def how(self) -> str:
        """'exit status 0', 'killed by SIGSEGV'."""
        if self.signum is None:
            return f"exit status {self.status}"
        try:
            return f"killed by {signal.Signals(self.signum).name}"
        except ValueError:
            return f"killed by signal {self.signum}"


def supervise(command: Callable[[], int]) -> Ended:
    """Run `command` in a forked child and report how that child ended, so that a process that ends
    without its command finishing is told apart from one whose command returned: code run in the
    process (a kernel library, a backend run in-process) may call os._exit(0) and end it with the
    status of a run that passed. The child exits with `command()`'s status (SystemExit: this function
    does not return there); what the command started and left running (a backend's forked children,
    handed to this process as their subreaper on Linux) is ended once the child has, after
    LEFTOVER_SECONDS to end by itself. A signal sent to this process (kill, not the terminal, which
    signals the child as well) is passed on to the child; the child dies with this process
    (PR_SET_PDEATHSIG). Where the platform cannot fork, `command` runs here and counts as finished."""
    if not hasattr(os, "fork") or not hasattr(signal, "sigwaitinfo"):
        return Ended(command(), None, True)
    reader, writer = os.pipe()  # the child writes its pid here once its command is over
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)  # none lost between fork and the wait
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        _run_child(command, writer, os.getppid())
    os.close(writer)
    try:
        status, sent = _wait_relaying(pid)
        finished = _said_finished(reader, pid)
        _end_leftovers()
    finally:
        os.close(reader)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if os.WIFSIGNALED(status):
        return Ended(None, os.WTERMSIG(status), finished, os.WTERMSIG(status) in sent)
    return Ended(os.waitstatus_to_exitcode(status), None, finished)


def _run_child(command: Callable[[], int], writer: int, parent: int) -> NoReturn:
    """The child's side: die with the supervisor, run `command`, say so, exit with its status."""
    _ask_for_signal_with_parent(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(ORPHANED)
    try:
        sys.exit(command())
    finally:  # returned, or raised (a traceback is an end the interpreter reports itself)
        with contextlib.suppress(OSError):
            os.write(writer, f"{os.getpid()}\n".encode())


def _wait_relaying(child: int) -> tuple[int, set[int]]:
    """The wait status of `child` and the signals sent to the command meanwhile (the terminal sends its
    own to the child as well; those sent to this process alone are passed on), reaping the orphans
    handed to this process."""
    sent: set[int] = set()
    while True:
        info = signal.sigwaitinfo(_WATCHED)
        if info.si_signo == signal.SIGCHLD:
            status = _reaped(child)
            if status is not None:
                return status, sent
            continue
        sent.add(info.si_signo)
        if info.si_code <= 0:  # sent by a process (SI_USER, SI_QUEUE, SI_TKILL); the terminal's are > 0
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, info.si_signo)


def _reaped(child: int) -> int | None:
    """Reap every child that has ended; `child`'s wait status when it is among them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == child:
            found = status


def _said_finished(reader: int, child: int) -> bool:
    """Whether `child` wrote its pid (its command was over) before it ended."""
    os.set_blocking(reader, False)
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(reader, 4096):
            data += chunk
    return str(child) in data.decode(errors="replace").split()


def _end_leftovers() -> None:
    """End the processes handed to this process (what the command left running): they get
    LEFTOVER_SECONDS to end by themselves (a fork server, a resource tracker end as soon as the run
    is gone), then SIGKILL; each reaped."""
    deadline = time.monotonic() + LEFTOVER_SECONDS
    while children := _children():
        if time.monotonic() > deadline:
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _reaped(-1)
        time.sleep(0.02)


def _children() -> list[int]:
    """The pids of this process's children, as /proc lists them ([] without /proc)."""
    try:
        pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    except OSError:
        return []
    return [pid for pid in pids if _parent_of(pid) == os.getpid()]


def _parent_of(pid: int) -> int | None:
    """Process `pid`'s parent (/proc/PID/stat field 4), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2:].split()[1])


def die_by(signum: int) -> NoReturn:
    """End this process with signal `signum`, as the process it stands for ended (its parent sees that
    signal, a shell prints 'Segmentation fault'); exit 128 + signum where the signal does not end it."""
    if signum not in (signal.SIGKILL, signal.SIGSTOP):  # no handler to reset: setting one is an OSError
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


def _prctl(option: int, value: int) -> None:
    """prctl(option, value) on Linux; nothing elsewhere."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def main(args: Sequence[str] | None = None) -> NoReturn:
    """`python -m difftest.core.lifetime --parent PID -- ARGV...`: exit with run_as_group(PID, ARGV)."""
    parser = argparse.ArgumentParser(prog="python -m difftest.core.lifetime",
                                     description="Run ARGV in a process group that is SIGKILLed when PID dies.")
    parser.add_argument("--parent", type=int, required=True, metavar="PID",
                        help="the pid of the process starting this one")
    parser.add_argument("argv", nargs="+", metavar="ARGV", help="the program and its arguments, after --")
    options = parser.parse_args(args)
    sys.exit(run_as_group(options.parent, options.argv))


if __name__ == "__main__":
    main()
