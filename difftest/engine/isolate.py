"""Backends in worker processes: a kernel that segfaults, aborts, hangs or breaks the CUDA context
costs its own verdict (CRASH, TIMEOUT) and nothing else; the run goes on with a fresh worker.

One long-lived worker per backend, fed cases over a duplex pipe:

    worker -> parent   ("ready", name) once it has rebuilt the backend, or ("fault", (text, traceback))
    parent -> worker   (tag, KernelInputs, Launch)                              one per case
    worker -> parent   ("outcome", tag, Execution | Fault)                       one per case

The tag numbers the calls to one worker: an answer whose tag is not the call's (a backend that forked
and returned in both processes answers twice) is dropped, never taken for the next call's answer.

How tensors travel is the worker's transport (transport_for). On the CPU, and on a GPU with
DIFFTEST_WORKER_TRANSPORT=copy, frames are torch.save bytes of CPU copies: the worker owns every
byte it touches, at the price of two device-host copies and a pickle each way. On a GPU the default
is CUDA IPC: frames carry memory handles, not bytes, so no tensor goes through the pipe however
long the context. The parent first copies the inputs into a memory pool of their own (torch.cuda.MemPool),
so the only parent memory a worker can reach holds nothing but that call's inputs: a kernel that
writes past them damages nothing the parent keeps (and its writes into them are what the input
checksums catch). The parent copies the outputs out of the worker's memory as soon as they arrive.

The worker rebuilds the backend from 'package.module:object' (recipe()) and runs guards.execute,
so poisoning, checksums and repeats are the same as in-process, and a backend that raises sends its
traceback back in its Fault, as formatted in the worker (guards.formatted_traceback). The parent waits `timeout` seconds
for an answer (all launches of the case together), then kills the worker: TIMEOUT. A pipe that
closes without an answer means the worker died: CRASH with its signal (SIGSEGV, SIGABRT) or exit
status and the tail of its stderr (faulthandler writes the Python stack there). A worker whose call
left the device unusable answers CRASH and exits. Whichever way a worker ends, the next case of that
backend starts a new one. A backend that cannot be rebuilt from a module path (made in a function,
in __main__, or configured after construction) runs in-process, and its results say why.

The operations other than paged logits (difftest.engine.operation_run) have a worker of their own,
OperationWorker: the backend object travels pickled, each call is one case out and the operation's output back
(CPU copies, one call at a time), with the same timeout, crash report and replacement.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import faulthandler
import io
import itertools
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import torch
import torch.multiprocessing  # registers the CUDA-IPC reductions ForkingPickler uses

from difftest.backends import Backend, Loaded, Origin, rebuild
from difftest.core.errors import SpecError, first_line
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import Isolation, Transport
from difftest.core.lifetime import die_with_parent, run_folder
from difftest.core.memory import ran_out
from difftest.core.verdict import Verdict
from difftest.engine.guards import (
    Execution,
    Fault,
    Launch,
    Outcome,
    PoisonFreshTensors,
    called_here,
    device_failure,
    execute,
    formatted_traceback,
    raised_by_backend,
)

DEFAULT_TIMEOUT = 600.0  # seconds one case may take in a worker when the run sets no --timeout
UNIX_SOCKET_PATH_MAX = 107  # bytes of a socket path: sun_path holds 108 on Linux, its terminating NUL included
STARTUP_TIMEOUT = 600.0  # seconds a worker may take to import and build its backend (a JIT library)
_STDERR_LINES = 4  # last lines of a dead worker's stderr quoted when faulthandler said nothing
# Device memory a process keeps cached, free, between calls before it gives it back. Giving it back
# (empty_cache) frees segments, which waits for the device: after every call that was 0.3-0.4 ms of the
# run's own time (H200 profiles, bench/README.md), most of it for a few MiB, on the thousands of
# small calls of a fuzz campaign; the workers paid it too.
CACHE_KEPT_BYTES = 512 << 20
# How often an idle worker looks whether the parent has let go of the large outputs it sent (_release_sent).
IDLE_COLLECT_SECONDS = 0.05


def transport_for(device: str) -> Transport:
    """How tensors reach a worker on `device`: CUDA IPC on a GPU, copies on the CPU or when
    DIFFTEST_WORKER_TRANSPORT=copy (SpecError for any other value)."""
    chosen = os.environ.get("DIFFTEST_WORKER_TRANSPORT")
    choices = [t.value for t in Transport]
    if chosen is not None and chosen not in choices:
        raise SpecError("DIFFTEST_WORKER_TRANSPORT", chosen, f"one of {choices}")
    return Transport.COPY if device != "cuda" else Transport(chosen or Transport.CUDA_IPC)


def _context() -> multiprocessing.context.BaseContext:
    """forkserver where the platform has it, else spawn; never plain fork. DIFFTEST_WORKER_START=spawn
    forces spawn (should a library ever touch CUDA at import in the fork server).

    A forked child of a process that has initialised CUDA cannot use CUDA, so the parent is never
    forked. The fork server is a fresh interpreter that imports torch and this module once
    (without touching CUDA); each worker forked from it starts in milliseconds instead of the
    seconds a spawned interpreter takes to import torch, which matters since a crashing backend
    needs a new worker for every case.
    """
    method = os.environ.get("DIFFTEST_WORKER_START", "forkserver")
    if method not in ("forkserver", "spawn"):
        raise SpecError("DIFFTEST_WORKER_START", method, "forkserver or spawn")
    _start_helpers_isolated()
    if method == "spawn" or "forkserver" not in multiprocessing.get_all_start_methods() or not _forkserver_fits():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # torch._dynamo: entering the first dispatch mode (guards.PoisonFreshTensors) imports it, 1.5 s.
    context.set_forkserver_preload([__name__, "torch._dynamo"])
    return context


def _start_helpers_isolated() -> None:
    """From now on, every interpreter multiprocessing starts (the fork server, its resource tracker, a spawned
    worker) starts isolated (helper_command). Installed once, in front of multiprocessing's one way to start
    them: each builds `python FLAGS -c CODE`, and `-c` puts the working folder first on sys.path, so a
    `multiprocessing/` or `selectors.py` in the folder a replay runs from ran before any code of difftest's."""
    global _spawn_helper
    if _spawn_helper is not None:
        return
    _spawn_helper = multiprocessing.util.spawnv_passfds

    def spawn_isolated(path: str, args: list[str], passfds: Any) -> int:
        assert _spawn_helper is not None
        return _spawn_helper(path, helper_command(args, sys.path), passfds)

    multiprocessing.util.spawnv_passfds = spawn_isolated


_spawn_helper: Callable[[str, list[str], Any], int] | None = None  # multiprocessing's own, once replaced


def helper_command(argv: list[str], path: list[str]) -> list[str]:
    """A helper interpreter's command line `python FLAGS -c CODE ARGS` made isolated: -I (no working folder, no
    PYTHONPATH, no user site on its sys.path), then CODE run with sys.path set to `path` (this process's own,
    so it imports the same difftest and backends this process does, a PYTHONPATH checkout's included) before
    any import. A command line without -c is returned as it is."""
    if "-c" not in argv:
        return list(argv)
    at = argv.index("-c")
    code = f"import sys; sys.path[:] = {list(path)!r}\n{argv[at + 1]}"
    return [*argv[:at], "-I", "-c", code, *argv[at + 2:]]


def _forkserver_fits() -> bool:
    """Whether the fork server's socket, TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX, fits a Unix socket
    address (107 bytes on Linux): under a longer TMPDIR starting the server fails ("AF_UNIX path too
    long"), and the workers are spawned instead."""
    socket = os.path.join(tempfile.gettempdir(), "pymp-" + "x" * 8, "listener-" + "x" * 8)
    return len(os.fsencode(socket)) <= UNIX_SOCKET_PATH_MAX


Pending = Callable[[], Outcome]  # waits for a submitted call's outcome


class Executor(Protocol):
    """Where a backend's call runs: `isolation` and `note` are what the result records about it.
    `submit` starts the call and returns what waits for its outcome, so that calls in different
    processes overlap; calling the executor does both."""

    isolation: Isolation
    note: str | None

    @property
    def queues(self) -> bool:
        """Whether a call may be submitted while another is in flight (its outcome may be asked for in
        any order)."""
        ...

    def submit(self, backend: Backend, inputs: KernelInputs, launch: Launch) -> Pending: ...

    def __call__(self, backend: Backend, inputs: KernelInputs, launch: Launch) -> Outcome: ...


@dataclasses.dataclass(frozen=True)
class InProcess:
    """The call runs in this process, when its outcome is asked for: a backend that kills the
    process then finds every earlier result already reported."""

    note: str | None = None  # why, when isolation was asked for
    isolation: Isolation = Isolation.IN_PROCESS
    queues = False  # a call runs when its outcome is asked for: nothing to overlap

    def submit(self, backend: Backend, inputs: KernelInputs, launch: Launch) -> Pending:
        return lambda: execute(backend, inputs, launch)

    def __call__(self, backend: Backend, inputs: KernelInputs, launch: Launch) -> Outcome:
        return self.submit(backend, inputs, launch)()


# --------------------------------------------------------------------------- frames

def _dumps(obj: object, transport: Transport = Transport.COPY) -> memoryview | bytes:
    if transport == Transport.CUDA_IPC:
        return ForkingPickler.dumps(obj)  # torch.multiprocessing's reductions: CUDA tensors as IPC handles
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getbuffer()  # no copy: a 100K-context cache is a gigabyte


def _loads(data: bytes, transport: Transport = Transport.COPY) -> Any:
    # Frames come only from this module's own processes.
    if transport == Transport.CUDA_IPC:
        return pickle.loads(data)
    return torch.load(io.BytesIO(data), weights_only=False)


def _mapped(inputs: KernelInputs, change: Callable[[torch.Tensor], torch.Tensor]) -> KernelInputs:
    """`inputs` with `change` applied to every tensor field."""
    tensors = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
    return dataclasses.replace(inputs, **{k: change(v) for k, v in tensors.items() if isinstance(v, torch.Tensor)})


def _moved(inputs: KernelInputs, device: str | torch.device) -> KernelInputs:
    return _mapped(inputs, lambda t: t.to(device))


def _outputs_moved(outcome: Outcome, device: str | torch.device, copy: bool = False) -> Outcome:
    """`outcome` with its outputs on `device`; copied even when already there if `copy`."""
    if isinstance(outcome, Execution):
        return dataclasses.replace(outcome, outputs=tuple(t.to(device, copy=copy) for t in outcome.outputs))
    return outcome


def _shipped(inputs: KernelInputs, pool: Any) -> KernelInputs:
    """Copies of `inputs`' tensors allocated from `pool` (a torch.cuda.MemPool): what a worker may reach."""
    with torch.cuda.use_mem_pool(pool):
        return _mapped(inputs, torch.Tensor.clone)


def release_cache() -> None:
    """Give the current GPU's cached free memory back once it passes CACHE_KEPT_BYTES: what a call's
    inputs were shipped in (a memory pool per call) or what a backend allocated stays cached until then."""
    # One read of the allocator's statistics, left nested: memory_reserved() and memory_allocated() each
    # flatten all of them (a warm H200 campaign spent 1.1 s of its 30 s there).
    if not torch.cuda.is_initialized():
        return  # nothing allocated, nothing cached (and no statistics to read)
    stats = torch.cuda.memory_stats_as_nested_dict()
    if stats["reserved_bytes"]["all"]["current"] - stats["allocated_bytes"]["all"]["current"] > CACHE_KEPT_BYTES:
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- the worker process

def serve(conn: Connection, origin: Origin, device: str, log_path: str, transport: Transport = Transport.COPY,
          environ: Mapping[str, str] | None = None, run_pid: int | None = None) -> None:
    """The worker's main: die with the run (process `run_pid`), take the parent's environment,
    rebuild the backend, then answer cases until the pipe closes."""
    _die_with(run_pid)
    if environ is not None:
        # Forked from a fork server, the worker would otherwise inherit the environment of the
        # moment the server started: a CUDA_VISIBLE_DEVICES or library switch set since then in
        # the parent would be silently missing. CUDA is not initialised yet, so it all applies.
        os.environ.clear()
        os.environ.update(environ)
    _redirect_output(log_path)
    if device == "cpu":
        # Workers run side by side: one thread each, so N workers on N cores do not oversubscribe them.
        torch.set_num_threads(1)
    try:
        backend = rebuild(origin)
    except BaseException as exc:  # anything that stops the import is the answer
        conn.send_bytes(_dumps(("fault", (f"{type(exc).__name__}: {exc}", formatted_traceback(exc))), transport))
        return
    # The first dispatch mode imports torch._dynamo (1.5 s where the fork server did not preload
    # it): paid here, before "ready", so it never counts against a case's timeout.
    with PoisonFreshTensors():
        torch.empty(0)
    conn.send_bytes(_dumps(("ready", backend.name), transport))
    while True:
        try:
            tag, inputs, launch = _loads(conn.recv_bytes(), transport)
        except EOFError:
            return
        outcome = execute(backend, _moved(inputs, device), launch)
        del inputs  # over IPC: the parent's memory, released as soon as the call is over
        crashed = isinstance(outcome, Fault) and outcome.verdict == Verdict.CRASH
        if device == "cuda" and not crashed:  # after a sticky CUDA error any CUDA call aborts the process
            release_cache()  # what the call cached goes back: seven workers share one GPU
        # Over IPC the outputs stay on the GPU (the parent copies them out); a CPU tensor among them
        # would need a file descriptor passed along, so it goes over as a GPU tensor too.
        outgoing = _outputs_moved(outcome, device if transport == Transport.CUDA_IPC else "cpu")
        sent = _output_bytes(outcome)
        try:
            conn.send_bytes(_dumps(("outcome", tag, outgoing), transport))
        except Exception as exc:  # an output the transport cannot carry
            unsent = Fault(Verdict.ERROR, f"output not sendable: {exc}", 0.0)
            conn.send_bytes(_dumps(("outcome", tag, unsent), transport))
        if crashed:
            return  # the device is unusable in this process; the parent starts a new worker
        # Idle, this worker must not hold the outputs it sent: side by side, eleven workers each keeping a
        # 2^31-logit output (8 GiB) left none for the next call.
        del outcome, outgoing
        if transport == Transport.CUDA_IPC and sent > CACHE_KEPT_BYTES:
            _release_sent(conn)


def _output_bytes(outcome: Outcome) -> int:
    """Bytes of an outcome's outputs (0 for a fault)."""
    if not isinstance(outcome, Execution):
        return 0
    return sum(t.numel() * t.element_size() for t in outcome.outputs)


def _release_sent(conn: Connection) -> None:
    """Until the next call arrives, give the device memory of the outputs just sent back once the parent
    has copied them out. Over CUDA IPC the sender keeps a block alive until its receiver lets go of it,
    and torch frees it only at its next collection (torch.cuda.ipc_collect, or an allocation of this
    process's that fails): without one, an idle worker would hold its last outputs."""
    while not conn.poll(IDLE_COLLECT_SECONDS):
        allocated = torch.cuda.memory_allocated()
        torch.cuda.ipc_collect()
        release_cache()
        if torch.cuda.memory_allocated() < allocated:
            return  # collected: the parent has let go


def _die_with(run_pid: int | None) -> None:
    """Make this worker end when the run that started it ends, however it ends (SIGKILL included).

    Ctrl-C reaches the whole process group: a worker ignores it (the run kills its workers when it
    stops). PR_SET_PDEATHSIG (Linux) kills the worker when its parent dies: the fork server, which
    exits when the run's end of its pipe closes, or the run itself under spawn. (No watching thread:
    faulthandler would name its frame, not the backend's, as the innermost on a crash.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A child of the fork server holds a copy of the run's end of the server's "alive" pipe: the server
    # would outlive the run as long as a worker does, and the worker outlive the server. Dropped.
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None and multiprocessing.parent_process() is not None:
        with contextlib.suppress(OSError):
            os.close(alive)
        server._forkserver_alive_fd = None
    die_with_parent(run_pid)


def _redirect_output(log_path: str) -> None:
    """The backend's prints and the fatal-signal stack go to the log the parent quotes on a crash."""
    log = open(log_path, "ab", buffering=0)  # open for the life of the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    # Each line printed reaches the log at once, or a crash right after it loses it: a helper interpreter starts
    # with -I, which ignores the PYTHONUNBUFFERED the device scripts set.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):  # replaced by an object without reconfigure
            stream.reconfigure(line_buffering=True)
    faulthandler.enable(file=log)


# --------------------------------------------------------------------------- the parent's side

@dataclasses.dataclass(eq=False)
class _Call:
    """A call sent to a worker: what reads its answer (in turn), then its outcome."""

    answer: Callable[[], Outcome]
    outcome: Outcome | None = None


class Worker:
    """One backend's worker process, started on demand and replaced after it dies or hangs."""

    isolation, note = Isolation.WORKER, None

    def __init__(self, origin: Origin, device: str, timeout: float, log_dir: Path,
                 startup_timeout: float = STARTUP_TIMEOUT) -> None:
        self.origin, self.device, self.timeout, self.log_dir = origin, device, timeout, log_dir
        self.startup_timeout = startup_timeout
        self.transport = transport_for(device)
        self.process: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.ready = False
        self.started = 0  # processes started so far: one more each time a worker is replaced
        # When the last answer came: a call sent while another was in flight starts no earlier, and its
        # timeout counts from then.
        self.answered_at = 0.0
        self.starting: threading.Thread | None = None  # start_soon's thread, until joined
        self.unanswered: collections.deque[_Call] = collections.deque()  # sent, answer not yet read
        self.tags = itertools.count(1)  # numbers the calls: an answer carries its call's

    @property
    def queues(self) -> bool:
        """Over CUDA IPC a call's message is a few handles. Copied, a call and an answer can each pass the
        pipe's buffer: this process blocked sending the next call while the worker blocks sending the
        last answer would wait forever."""
        return self.transport == Transport.CUDA_IPC

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.started}.log"

    def start(self) -> None:
        """Start the process; it loads the backend while the parent goes on."""
        self.started += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        parent_conn, child_conn = multiprocessing.Pipe()
        self.process = _context().Process(target=serve, args=(child_conn, self.origin, self.device, str(self.log_path),
                                                              self.transport, dict(os.environ), os.getpid()),
                                               daemon=True)
        self.process.start()
        child_conn.close()  # so the parent sees EOF when the child dies
        self.conn, self.ready = parent_conn, False

    def start_soon(self) -> None:
        """start() in a thread: with a fork server, starting the first worker waits for the server to
        import torch (seconds), while the run could already draw its first cases. Whatever touches the
        process next waits for that thread first."""
        self.starting = threading.Thread(target=self._start_quietly, name="difftest-worker-start", daemon=True)
        self.starting.start()

    def _start_quietly(self) -> None:
        try:
            self.start()
        except Exception:  # left unstarted: submit starts it again, and its error is raised there
            self.process, self.conn = None, None

    def _started_soon(self) -> None:
        if self.starting is not None:
            self.starting.join()
            self.starting = None

    def submit(self, backend: Backend, inputs: KernelInputs, launch: Launch) -> Pending:
        """Send the call to the worker (started, or replaced, first); what waits for the answer."""
        self._started_soon()
        if self.process is None:
            self.start()
        fault = self._await_ready()
        if fault is not None:
            return lambda: fault
        assert self.conn is not None
        start = time.perf_counter()
        # Kept referenced until the answer is in: over IPC the worker reads this very memory. A pool of
        # its own per call (the only parent memory a worker can reach is that call's inputs), released
        # with it: pools kept per worker held every worker's largest inputs at once (out of memory on
        # 256K-context batches, seven backends).
        shipped = _shipped(inputs, torch.cuda.MemPool()) if self.transport == Transport.CUDA_IPC else \
            _moved(inputs, "cpu")
        tag = next(self.tags)
        try:
            self.conn.send_bytes(_dumps((tag, shipped, launch), self.transport))
        except OSError:
            died = self._died(time.perf_counter() - start)
            return lambda: died
        sent_to = self.started
        call = _Call(lambda: self._answered(sent_to, start, shipped, tag, (backend, inputs, launch)))
        self.unanswered.append(call)
        return lambda: self._outcome_of(call)

    def _outcome_of(self, call: _Call) -> Outcome:
        """`call`'s outcome. Answers come back in the order the calls went out: the ones sent before it
        and not yet asked for are taken first, and kept until asked for."""
        while call.outcome is None:
            earliest = self.unanswered.popleft()
            earliest.outcome = earliest.answer()
        return call.outcome

    def _answered(self, sent_to: int, start: float, shipped: KernelInputs, tag: int,
                  call: tuple[Backend, KernelInputs, Launch]) -> Outcome:
        """The call's outcome. One sent while another was in flight went down with the process if that
        one crashed or hung: it is sent again, to the new worker."""
        if self.conn is None or self.started != sent_to:
            return self.submit(*call)()
        return self._released(self._answer(start, shipped, tag))

    def _released(self, outcome: Outcome) -> Outcome:
        """`outcome`, the device memory of earlier calls' inputs (and their pools) given back."""
        if self.transport == Transport.CUDA_IPC:
            release_cache()
        return outcome

    def __call__(self, backend: Backend, inputs: KernelInputs, launch: Launch) -> Outcome:
        return self.submit(backend, inputs, launch)()

    def _answer(self, start: float, shipped: KernelInputs, tag: int) -> Outcome:
        """The outcome of the call `tag` sent at `start`; `shipped` (its inputs) lives until then."""
        assert self.conn is not None
        start = max(start, self.answered_at)
        answer_tag = None
        while answer_tag != tag:  # an answer tagged otherwise answers an earlier call a second time: dropped
            if not self.conn.poll(max(0.0, start + self.timeout - time.perf_counter())):
                self.kill()
                return Fault(Verdict.TIMEOUT, f"no answer within {self.timeout:g} s; the worker was killed",
                             time.perf_counter() - start)
            try:
                _kind, answer_tag, outcome = _loads(self.conn.recv_bytes(), self.transport)
            except (EOFError, OSError):
                return self._died(time.perf_counter() - start)
        self.answered_at = time.perf_counter()
        if isinstance(outcome, Fault) and outcome.verdict == Verdict.CRASH:
            self.stop()
        # Over IPC the outputs are the worker's memory: copied out now, before it is reused or dies.
        return _outputs_moved(outcome, self.device, copy=self.transport == Transport.CUDA_IPC)

    def _await_ready(self) -> Fault | None:
        if self.ready:
            return None
        assert self.conn is not None
        if not self.conn.poll(self.startup_timeout):
            self.kill()
            why = f"the worker did not load {self.origin.target} within {self.startup_timeout:g} s (start-up timeout)"
            return Fault(Verdict.TIMEOUT, why, 0.0)
        try:
            kind, payload = _loads(self.conn.recv_bytes(), self.transport)
        except (EOFError, OSError):
            return self._died(0.0, while_="loading the backend")
        if kind != "ready":
            self.stop()
            why, trace = payload
            return Fault(Verdict.ERROR, f"the worker could not load {self.origin.target}: {why}", 0.0, traceback=trace)
        self.ready = True
        return None

    def _died(self, seconds: float, while_: str = "the call") -> Fault:
        """CRASH: how the process ended and the last lines it wrote."""
        assert self.process is not None
        fault = _death(self.process, self.log_path, seconds, while_)
        self.stop()
        return fault

    def kill(self) -> None:
        """SIGKILL the process (a hung kernel ignores anything gentler) and forget it."""
        self._started_soon()
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        self.stop()

    def stop(self) -> None:
        """Close the pipe (a live worker exits on EOF), reap the process, forget both."""
        self._started_soon()
        _reap(self.process, self.conn)
        self.process, self.conn, self.ready = None, None, False


def _death(process: multiprocessing.process.BaseProcess, log_path: Path, seconds: float, while_: str) -> Fault:
    """The CRASH of a worker that died during `while_`: how its process ended and the last lines it wrote."""
    process.join(10)
    tail = crash_summary(log_path)
    return Fault(Verdict.CRASH, f"worker {exit_description(process.exitcode)} during {while_}"
                 + (f"; stderr: {tail}" if tail else ""), seconds)


def _reap(process: multiprocessing.process.BaseProcess | None, conn: Connection | None) -> None:
    """Close the pipe (a live worker exits on EOF) and reap the process, killed if it lingers."""
    if conn is not None:
        conn.close()
    if process is not None:
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join()


def exit_description(exitcode: int | None) -> str:
    """'killed by SIGSEGV', 'exited with status 3', ... for a multiprocessing exit code."""
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def crash_summary(path: Path) -> str:
    """What a dead worker's log says about its death, on one line.

    faulthandler writes "Fatal Python error: Segmentation fault" and the Python stack, innermost
    frame first; a C++ abort prints its what() just before. Those lines, else the log's last lines.
    """
    try:
        text = path.read_bytes()[-16384:].decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
    if fatal is None:
        return " | ".join(lines[-_STDERR_LINES:])
    frame = next((line for line in lines[fatal:] if line.startswith("File ")), None)
    # A C++ abort prints its what() (a CUDA error, say) above a long stack: that line says the most.
    cause = next((line for line in lines[:fatal] if "CUDA error" in line or line.startswith("what():")), None)
    said = lines[max(0, fatal - 2):fatal]
    said = [cause, *said] if cause and cause not in said else said
    return " | ".join([*said, lines[fatal], *([f"innermost {frame}"] if frame else [])])


class WorkerPool:
    """A Worker for every backend that can be rebuilt in a fresh process, InProcess for the rest.

    The workers' logs live in one folder (difftest-workers-*, in lifetime.run_folder), removed when the
    pool closes; a small reaper process removes it, and the whole run folder, should this process die
    without closing the pool (SIGKILL): it waits for its stdin, which only this process holds open, to
    close. (A reaper killed along with the run, a whole process group SIGKILLed, leaves the run folder
    to the next run's lifetime.sweep.)"""

    def __init__(self, backends: list[Loaded], device: str, timeout: float | None,
                 startup_timeout: float = STARTUP_TIMEOUT) -> None:
        self.log_dir = Path(tempfile.mkdtemp(prefix="difftest-workers-", dir=run_folder()))
        # multiprocessing's own temp folder (pymp-*), which it removes only at a clean exit, and the
        # run folder, which an atexit hook removes
        self.reaper = _reaper(self.log_dir, Path(multiprocessing.util.get_temp_dir()), run_folder())
        limit = timeout or DEFAULT_TIMEOUT
        self.executors: list[Executor] = [self._executor(b, index, device, limit, startup_timeout)
                                          for index, b in enumerate(backends)]

    def _executor(self, backend: Loaded, index: int, device: str, timeout: float, startup_timeout: float) -> Executor:
        if backend.origin.target is None:
            return InProcess(note=backend.origin.why_not)
        return Worker(backend.origin, device, timeout, self.log_dir / str(index), startup_timeout)

    def __enter__(self) -> WorkerPool:
        # Started together, so the backends' imports overlap, and while this process goes on.
        for executor in self.executors:
            if isinstance(executor, Worker):
                executor.start_soon()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        # Interrupted (Ctrl-C, an error): kill, since a worker may be mid-call; else let them exit.
        for executor in self.executors:
            if isinstance(executor, Worker) and kind is not None:
                executor.kill()
            elif isinstance(executor, Worker):
                executor.stop()
        shutil.rmtree(self.log_dir, ignore_errors=True)
        if self.reaper is not None:
            with contextlib.suppress(OSError):  # "done": this process lives on, its pymp-* folder with it
                self.reaper.stdin.write(b"done")  # type: ignore[union-attr]
                self.reaper.stdin.close()  # type: ignore[union-attr]
            try:
                self.reaper.wait(10)
            except subprocess.TimeoutExpired:
                self.reaper.kill()
                self.reaper.wait()


# Run by the reaper: ignore Ctrl-C (the run cleans up itself then) and wait for stdin to close. "done"
# (the pool closed): remove the run folder, already gone. Nothing (this process died): the others too.
_REAPER = ("import shutil, signal, sys, time\n"
           "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
           "folders = sys.argv[1:] if sys.stdin.buffer.read() != b'done' else sys.argv[1:2]\n"
           "for _ in range(30):\n"
           "    for folder in folders:\n"
           "        shutil.rmtree(folder, ignore_errors=True)\n"
           "    if len(folders) == 1:\n"
           "        break\n"
           "    time.sleep(0.1)\n")


def _reaper(folder: Path, *at_death: Path) -> subprocess.Popen | None:
    """The process that removes `folder` (and the `at_death` folders) once this process is gone (None
    where it cannot start): dying workers may still write their logs for a moment, so it keeps
    removing for a few seconds."""
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER, str(folder), *map(str, at_death)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                close_fds=True)
    except OSError:
        return None



# --------------------------------------------------------------------------- operations other than paged logits

@dataclasses.dataclass(frozen=True)
class Called:
    """What an operation's call (difftest.core.operation.Operation.call) returned, and how long it took."""

    output: Any
    seconds: float


def serve_operation(conn: Connection, device: str, log_path: str, environ: Mapping[str, str] | None = None,
                    run_pid: int | None = None) -> None:
    """An operation worker's main (OperationWorker): like serve, but the first message is the pickled (call,
    backend), each one after it a case (on the CPU, moved to `device` here), and each answer `call(backend,
    case)` as a Called (its output on the CPU) or the Fault of the exception it raised."""
    _die_with(run_pid)
    if environ is not None:  # as in serve: the parent's environment, not the fork server's
        os.environ.clear()
        os.environ.update(environ)
    _redirect_output(log_path)
    try:
        call, backend = pickle.loads(conn.recv_bytes())  # after the redirect: an import that fails is logged
    except Exception as exc:  # anything that stops the import is the answer
        conn.send_bytes(_dumps(("fault", (f"{type(exc).__name__}: {exc}", formatted_traceback(exc)))))
        return
    conn.send_bytes(_dumps(("ready", None)))
    while True:
        try:
            case = _loads(conn.recv_bytes())
        except EOFError:
            return
        started = time.perf_counter()
        try:  # moving the case in runs out of memory as the call may: the same answer, and this worker goes on
            # called_here, as in-process: a SystemExit is the backend's ERROR, a forked copy never answers
            got = called_here(lambda: call(backend, case.to(device)))  # noqa: B023 (called at once)
            answer: Called | Fault = Called(_tree_moved(got, "cpu", device), time.perf_counter() - started)
        except Exception as exc:  # the backend raised: sent back as in-process it would be judged
            raised = raised_by_backend(exc)
            answer = Fault(Verdict.ERROR, first_line(exc), time.perf_counter() - started,
                           error_type=type(raised).__name__, traceback=formatted_traceback(raised))
            # A sticky CUDA error (as guards.execute): CRASH, and this process, unusable now, ends after answering
            broken = None if ran_out(raised) else device_failure(torch.device(device))
            if broken is not None:
                answer = dataclasses.replace(answer, verdict=Verdict.CRASH,
                                             reason=f"{answer.reason} (device unusable afterwards: {broken})")
        try:
            conn.send_bytes(_dumps(("outcome", answer)))
        except Exception as exc:  # an output torch.save cannot carry
            conn.send_bytes(_dumps(("outcome", Fault(Verdict.ERROR, f"output not sendable: {exc}", answer.seconds))))
        if isinstance(answer, Fault) and answer.verdict == Verdict.CRASH:
            return


def _tree_moved(value: Any, device: str, synchronize_on: str | None = None) -> Any:
    """`value` with every tensor in it (in tuples, lists, dicts and dataclasses) on `device`; the kernels of
    `synchronize_on` ('cuda') finished first, so an asynchronous error belongs to the call."""
    if synchronize_on == "cuda":
        torch.cuda.synchronize()
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_tree_moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _tree_moved(v, device) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _tree_moved(getattr(value, f.name), device)
                                             for f in dataclasses.fields(value) if f.init})
    return value


class OperationWorker:
    """The worker process of one backend of an operation other than paged logits (difftest.engine.operation_run):
    started on demand, fed one case at a time, replaced after it dies or hangs. The backend travels pickled
    (cannot_pickle says why one cannot); cases and outputs travel as torch.save bytes of CPU copies."""

    def __init__(self, call: Callable[[Any, Any], Any], backend: Any, device: str, timeout: float, log_dir: Path,
                 startup_timeout: float = STARTUP_TIMEOUT) -> None:
        self.call, self.backend, self.device, self.timeout = call, backend, device, timeout
        self.log_dir, self.startup_timeout = log_dir, startup_timeout
        self.process: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.started = 0  # processes started so far: each writes a log of its own

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.started}.log"

    def __call__(self, case: Any) -> Called | Fault:
        """`call(backend, case)` in the worker (started, or replaced, first): its Called, or the Fault of an
        exception (ERROR), of the worker's death (CRASH) or of no answer within the timeout (TIMEOUT)."""
        fault = self._started()
        if fault is not None:
            return fault
        assert self.conn is not None
        start = time.perf_counter()
        try:
            self.conn.send_bytes(_dumps(case.to("cpu")))
            if not self.conn.poll(self.timeout):
                self.kill()
                return Fault(Verdict.TIMEOUT, f"no answer within {self.timeout:g} s; the worker was killed",
                             time.perf_counter() - start)
            _kind, answer = _loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            return self._died(time.perf_counter() - start)
        return _tree_moved(answer, self.device) if isinstance(answer, Called) else answer

    def _started(self) -> Fault | None:
        """Start the process unless it runs, and wait for it to load: None once ready, else its Fault."""
        if self.process is not None:
            return None
        self.started += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        parent_conn, child_conn = multiprocessing.Pipe()
        process = _context().Process(target=serve_operation, daemon=True, args=(
            child_conn, self.device, str(self.log_path), dict(os.environ), os.getpid()))
        try:
            process.start()
        finally:
            child_conn.close()  # so the parent sees EOF when the child dies
        self.process, self.conn = process, parent_conn
        try:
            self.conn.send_bytes(pickle.dumps((self.call, self.backend)))
            if not self.conn.poll(self.startup_timeout):
                self.kill()
                return Fault(Verdict.TIMEOUT, f"the worker did not start within {self.startup_timeout:g} s "
                             "(start-up timeout)", 0.0)
            kind, payload = _loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            return self._died(0.0, while_="loading the backend")
        if kind != "ready":
            self.stop()
            why, trace = payload
            return Fault(Verdict.ERROR, f"the worker could not load the backend: {why}", 0.0, traceback=trace)
        return None

    def _died(self, seconds: float, while_: str = "the call") -> Fault:
        """CRASH: how the process ended and the last lines it wrote."""
        assert self.process is not None
        fault = _death(self.process, self.log_path, seconds, while_)
        self.stop()
        return fault

    def kill(self) -> None:
        """SIGKILL the process (a hung kernel ignores anything gentler) and forget it."""
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        self.stop()

    def stop(self) -> None:
        """Close the pipe (a live worker exits on EOF), reap the process, forget both."""
        _reap(self.process, self.conn)
        self.process, self.conn = None, None


def cannot_pickle(*objects: Any) -> str | None:
    """Why `objects` cannot travel to a worker process (pickle's words), or None when they can."""
    try:
        pickle.dumps(objects)
    except Exception as exc:  # pickle raises many kinds: each is the reason
        return f"{type(exc).__name__}: {exc}"
    return None
