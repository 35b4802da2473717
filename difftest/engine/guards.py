"""What the engine does around one backend call: poison, checksum and repeat.

Poisoning (what a backend that leaves output unwritten shows as FAIL(unwritten)):
* Guaranteed, CPU and CUDA: a buffer the engine hands over (contract.writes_into_output) is all
  poison (difftest.core.poison); and every float32/bfloat16/float16 tensor the backend creates through
  torch's empty-family factories while it runs (torch.empty, empty_like, new_empty, empty_strided,
  and at::empty called by a C++ extension, since that goes through the dispatcher) starts as poison.
* Best effort, CUDA only: before each launch, blocks the size of the output are taken from the
  caching allocator, poisoned and freed, so memory the backend takes from the allocator without
  the dispatcher (raw_alloc, a registered custom op's internal outputs) is likely, not certain, to
  be poisoned: the allocator hands back a cached block of that size, but other cached blocks of
  the same size, or PYTORCH_NO_CUDA_MEMORY_CACHING=1, defeat it.
* Not on the CPU: glibc's malloc reuses a freed block for the next allocation of that size only
  sometimes (measured: from 0 to 100 % of outputs landing on poison depending on the size and
  what was allocated before), so raw CPU memory is not poisoned at all rather than unreliably.

Checksums: every input tensor (q, kv_cache, weights, context_lens, block_table, indices) is
fingerprinted before the first launch and after the last; a change names the tensor.
The other operations (difftest.core.operation.Operation) get the same guards through GuardedCall: each
backend the call reaches (Operation.watched: a composition's stages) has every tensor field of the inputs it
is handed checksummed around each launch, and its fresh float tensors poisoned; each launch's output is
checked against the operation's Expected tensors (output_violation) before anything judges it.
Repeats: the backend is launched `repeat` times on the same inputs; difftest.engine.stability compares the
outputs. Timing (`time` launches, difftest.engine.timing) comes after the last checksum, unpoisoned, and
touches no verdict.
Memory: on a GPU, a launch of more than difftest.core.memory.MEASURED_FROM_LOGITS logits has its peak
allocation measured (torch.cuda.max_memory_allocated less what was allocated before it), so the runner's
side-by-side rule counts what a backend allocates where its contract declares nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from difftest.backends import Backend, base, user
from difftest.core.contract import Contract
from difftest.core.errors import exception_text
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.memory import MEASURED_FROM_LOGITS, ran_out
from difftest.core.operation import Expected
from difftest.core.poison import INT_OF_SIZE, POISON_BITS, poisoned
from difftest.core.verdict import Verdict
from difftest.engine.timing import Timing, time_launches

INPUT_FIELDS = ("q", "kv_cache", "weights", "context_lens", "block_table", "indices")
# Words summed at once by fingerprint(): bounds the int64 temporaries to 2 x 128 MiB.
_CHUNK_WORDS = 1 << 24
# Cached CUDA blocks of the output's size poisoned before each launch (see the module docstring).
_POISONED_BLOCKS = 4
# Characters of a raised exception's traceback a result keeps: its innermost frames and the message, where
# the bug is, and a bound on what a report carries per result (a recursion's traceback runs to megabytes).
MAX_TRACEBACK_CHARS = 1 << 14
# Frames formatted_traceback leaves out above the backend's own: this module's, the Loaded wrapper's and the
# adapter that calls a decorated function.
_HARNESS_FILES = frozenset({__file__, base.__file__, user.__file__})
_EMPTY_FACTORIES = {torch.ops.aten.empty, torch.ops.aten.empty_strided, torch.ops.aten.empty_like,
                    torch.ops.aten.new_empty, torch.ops.aten.new_empty_strided}


@dataclasses.dataclass(frozen=True)
class Launch:
    """How the engine calls a backend on one case: the output it expects and how many launches."""

    rows: int
    max_model_len: int
    repeat: int = 1
    time: int = 0  # launches timed after the checked ones (difftest.engine.timing); 0: none


@dataclasses.dataclass(frozen=True)
class Execution:
    """The backend ran: one output per launch, the inputs it wrote into, the first launch's time."""

    outputs: tuple[torch.Tensor, ...]
    mutated: tuple[str, ...]
    seconds: float
    timing: Timing | None = None  # the timed launches, when asked for
    peak_bytes: int | None = None  # the most a launch allocated beyond what was allocated before it (measured)


@dataclasses.dataclass(frozen=True)
class Fault:
    """The backend did not return: ERROR (it raised), CRASH (its process or device died) or TIMEOUT."""

    verdict: Verdict
    reason: str
    seconds: float
    error_type: str | None = None  # the class name of the exception, when one was raised
    traceback: str | None = None  # that exception's traceback (formatted_traceback), when one was raised


Outcome = Execution | Fault


# --------------------------------------------------------------------------- checksums

def fingerprint(tensor: torch.Tensor) -> tuple[int, int]:
    """(sum of words, sum of words weighted by position + 1) over the tensor's bytes, on its device.

    Words are int32 where the byte count allows, else bytes; int64 sums wrap, which keeps them
    independent of the summation order. Any change of one word changes the first sum; moving words
    around changes the second. Computed on the tensor's device, so a 1 GiB cache costs no copy.
    """
    plain, weighted = _fingerprint_sums(tensor).tolist()
    return plain, weighted


def _fingerprint_sums(tensor: torch.Tensor) -> torch.Tensor:
    """fingerprint()'s two sums as an int64 tensor (2,) on the tensor's device: nothing waits for them."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    words = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw
    sums = torch.zeros(2, dtype=torch.int64, device=raw.device)
    for start in range(0, words.numel(), _CHUNK_WORDS):
        chunk = words[start:start + _CHUNK_WORDS].to(torch.int64)
        positions = torch.arange(start + 1, start + 1 + chunk.numel(), device=raw.device)
        sums += torch.stack([chunk.sum(), (chunk * positions).sum()])
    return sums


def input_fingerprints(inputs: KernelInputs) -> dict[str, tuple[int, int]]:
    """fingerprint() of every tensor a backend is handed, by field name; read back from each device
    at once (one wait per device instead of two per tensor: a dozen on every GPU call)."""
    return tensor_fingerprints({name: t for name in INPUT_FIELDS if isinstance(t := getattr(inputs, name),
                                                                             torch.Tensor)})


def tensor_fingerprints(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """fingerprint() of each named tensor, read back from each device at once."""
    sums = {name: _fingerprint_sums(t) for name, t in tensors.items()}
    prints: dict[str, tuple[int, int]] = {}
    for device in {t.device for t in sums.values()}:
        names = [name for name, t in sums.items() if t.device == device]
        for name, (plain, weighted) in zip(names, torch.stack([sums[n] for n in names]).tolist(), strict=True):
            prints[name] = (plain, weighted)
    return {name: prints[name] for name in tensors}


# --------------------------------------------------------------------------- poisoning

class PoisonFreshTensors(TorchDispatchMode):
    """While active, every tensor made by an empty-family factory starts as the poison NaN."""

    def __torch_dispatch__(self, func: Callable[..., Any], types: tuple[type, ...], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if getattr(func, "overloadpacket", None) in _EMPTY_FACTORIES and isinstance(out, torch.Tensor):
            fill_poison(out)
        return out


def fill_poison(tensor: torch.Tensor) -> None:
    """Overwrite `tensor` with the poison of its dtype, bit for bit; other dtypes are left alone."""
    if tensor.dtype not in POISON_BITS or tensor.numel() == 0:
        return
    as_int = INT_OF_SIZE[tensor.element_size()]
    # Copied as integers: a float copy may quiet or canonicalise the NaN payload.
    sentinel = poisoned((), tensor.dtype, tensor.device).view(as_int)
    tensor.view(as_int).copy_(sentinel.expand(tensor.shape))


def poison_cached_memory(nbytes: int, dtype: torch.dtype, device: torch.device) -> None:
    """CUDA: leave poisoned blocks of `nbytes` in the caching allocator for the next allocations."""
    if device.type != "cuda" or dtype not in POISON_BITS or nbytes == 0:
        return
    count = -(-nbytes // dtype.itemsize)
    held = [poisoned((count,), dtype, device) for _ in range(_POISONED_BLOCKS)]
    del held  # freed into the cache, poison and all


# --------------------------------------------------------------------------- the guarded call

def execute(backend: Backend, inputs: KernelInputs, launch: Launch) -> Outcome:
    """Call `backend` launch.repeat times under poison and checksums; never raises for its faults.

    A raised exception is ERROR, unless the device no longer runs anything afterwards (a sticky
    CUDA error such as an illegal memory access): then CRASH, since nothing after it can be trusted.
    Running out of memory is never sticky: that ERROR is not probed (a probe's own allocation may fail
    too), and the runner decides what it means (difftest.engine.call).
    That covers a BaseException the backend raises (SystemExit, a KeyboardInterrupt of its own), but
    not a Ctrl-C that arrives while it runs: that one stops the run. An output of the wrong type,
    shape, dtype or device is ERROR with the reason 'contract: expected ..., got ...'. A raised
    exception's traceback is kept (Fault.traceback).
    """
    start, caller = time.perf_counter(), os.getpid()
    try:
        with TorchState.kept():  # the timed launches too
            return _launches(backend, inputs, launch)
    except ContractViolation as exc:
        return Fault(Verdict.ERROR, str(exc), time.perf_counter() - start, "contract")
    except Exception as exc:  # the backend's fault becomes its verdict, never the run's end
        seconds = time.perf_counter() - start
        exc = raised_by_backend(exc)
        reason, trace = exception_text(exc), formatted_traceback(exc)
        broken = None if ran_out(exc) else device_failure(inputs.q.device)
        if broken is not None:
            return Fault(Verdict.CRASH, f"{reason} (device unusable afterwards: {broken})", seconds, type(exc).__name__,
                         trace)
        return Fault(Verdict.ERROR, reason, seconds, type(exc).__name__, trace)
    finally:
        if os.getpid() != caller:
            # A copy of this process the backend forked, returning (or raising) here: it must not go on
            # with the run (a second run writing the same report, answering the worker's pipe twice).
            os._exit(FORKED_COPY)


FORKED_COPY = 0  # exit status of a forked copy of the caller that the backend returned into


@dataclasses.dataclass(frozen=True)
class TorchState:
    """The process-wide torch settings a backend can change and the engine relies on after it: the
    default dtype and device (a backend calling torch.set_default_dtype(torch.float64) would make every
    later case's tensors float64), autograd, deterministic algorithms, matmul precision, CPU threads."""

    dtype: torch.dtype
    device: torch.device
    grad: bool
    deterministic: tuple[bool, bool]
    matmul_precision: str
    threads: int

    @classmethod
    def now(cls) -> TorchState:
        """The settings in force."""
        deterministic = (torch.are_deterministic_algorithms_enabled(),
                         torch.is_deterministic_algorithms_warn_only_enabled())
        return cls(torch.get_default_dtype(), torch.get_default_device(), torch.is_grad_enabled(), deterministic,
                   torch.get_float32_matmul_precision(), torch.get_num_threads())

    def restore(self) -> None:
        """Put back every setting that differs from this one."""
        now = TorchState.now()
        if now.dtype != self.dtype:
            torch.set_default_dtype(self.dtype)
        if now.device != self.device:  # cpu is also what get_default_device says when none was set
            torch.set_default_device(None if self.device == torch.device("cpu") else self.device)
        if now.grad != self.grad:
            torch.set_grad_enabled(self.grad)
        if now.deterministic != self.deterministic:
            torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        if now.matmul_precision != self.matmul_precision:
            torch.set_float32_matmul_precision(self.matmul_precision)
        if now.threads != self.threads:
            torch.set_num_threads(self.threads)

    @staticmethod
    @contextlib.contextmanager
    def kept() -> Iterator[None]:
        """The settings as they were before the block, once it ends, however it ends."""
        before = TorchState.now()
        try:
            yield
        finally:
            before.restore()


def formatted_traceback(exc: BaseException) -> str:
    """`exc`'s traceback as Python prints it (chained exceptions included), without difftest's own frames
    above the backend's (_HARNESS_FILES), cut to its last MAX_TRACEBACK_CHARS characters (the innermost
    frames and the message) at a frame's first line."""
    frames = exc.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename in _HARNESS_FILES:
        frames = frames.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, frames))
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    kept = text[len(text) - MAX_TRACEBACK_CHARS + 64:]
    kept = kept[kept.find("\n  File ") + 1:]
    return f"[... {len(text) - len(kept)} earlier characters cut]\n{kept}"


class ContractViolation(Exception):
    """The backend returned something other than the output its contract promises."""


class BackendRaised(Exception):
    """A BaseException that is no Exception (SystemExit, KeyboardInterrupt, GeneratorExit) raised by
    the backend itself, carried as an Exception so that it becomes the backend's ERROR."""

    def __init__(self, raised: BaseException) -> None:
        self.raised = raised
        super().__init__(exception_text(raised))


def raised_by_backend(exc: BaseException) -> BaseException:
    """The exception a backend's call raised: `exc`, or the one a BackendRaised carries."""
    return exc.raised if isinstance(exc, BackendRaised) else exc


# The signals that stop a run: Ctrl-C, and SIGTERM (`timeout`, a CI cancel), which the command turns into a stop.
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _StopWatch:
    """Around a backend call in the main thread: remembers whether a stopping signal arrived, so a
    KeyboardInterrupt it caused is told apart from one the backend raised itself, and a stop the backend
    swallowed (a bare `except:`) is not lost. The handlers in place (Python's, the command's) still run; a
    signal ignored or left to its default stays so."""

    def __init__(self) -> None:
        self.seen = False
        self.replaced: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}  # signal -> (its, ours)

    def __enter__(self) -> _StopWatch:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in STOPPING_SIGNALS:
            previous = signal.getsignal(signum)
            if callable(previous):
                self.replaced[signum] = (previous, self._heard(previous))
                signal.signal(signum, self.replaced[signum][1])
        return self

    def _heard(self, previous: Callable[..., Any]) -> Callable[..., Any]:
        def heard(signum: int, frame: Any) -> None:
            self.seen = True
            previous(signum, frame)

        return heard

    def __exit__(self, *exc: object) -> None:
        for signum, (previous, heard) in self.replaced.items():
            if signal.getsignal(signum) is heard:  # one set meanwhile (the command's, as it stops) stays
                signal.signal(signum, previous)


Returned = TypeVar("Returned")


def called_here(call: Callable[[], Returned]) -> Returned:
    """`call()`, a backend's call in this process, made as every such call is (the paged launches, an operation's
    call, in the run's process or a worker's): torch's process-wide settings put back after it (TorchState); a
    BaseException it raises that is no Exception (SystemExit, a KeyboardInterrupt of its own) raised as a
    BackendRaised, for the caller to make that backend's ERROR; a stop signalled while it ran (Ctrl-C, SIGTERM)
    raised as KeyboardInterrupt, even one the call swallowed or turned into another exception; and a forked copy
    of this process that the call returns (or raises) into ended on the spot, before it can go on with the run."""
    caller = os.getpid()
    try:
        with _StopWatch() as watch, TorchState.kept():
            try:
                returned = call()
            except Exception as exc:
                if watch.seen:
                    raise KeyboardInterrupt from exc
                raise
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt) and watch.seen:
                    raise  # a real stop: the run stops
                raise BackendRaised(exc) from exc
            if watch.seen:
                raise KeyboardInterrupt
            return returned
    finally:
        if os.getpid() != caller:
            os._exit(FORKED_COPY)


def _launches(backend: Backend, inputs: KernelInputs, launch: Launch) -> Execution:
    contract, device = backend.contract, inputs.q.device
    before = input_fingerprints(inputs)
    outputs, seconds, peaks = [], [], []
    watched = device.type == "cuda" and launch.rows * launch.max_model_len > MEASURED_FROM_LOGITS
    for _ in range(launch.repeat):
        out = _fresh_out(contract, launch, device)
        nbytes = launch.rows * launch.max_model_len * contract.output_dtype.itemsize
        poison_cached_memory(nbytes, contract.output_dtype, device)
        held = _peak_reset(device) if watched else 0
        start = time.perf_counter()
        with PoisonFreshTensors():  # the checks below run under the engine's settings (called_here)
            got = called_here(lambda: backend(inputs, out))  # noqa: B023 (called at once, in this iteration)
        synchronize(device)
        seconds.append(time.perf_counter() - start)
        if watched:
            peaks.append(torch.cuda.max_memory_allocated(device) - held)
        got = _checked_output(got, launch, contract.output_dtype, device)
        # A backend may hand back the same buffer every launch, timed ones included: keep each launch's bits apart.
        outputs.append(_bit_copy(got) if launch.repeat > 1 or launch.time else got)
    after = input_fingerprints(inputs)
    mutated = tuple(name for name in before if before[name] != after[name])
    # After the checksums: whatever the timed launches do, the verdict is made of what came before.
    timing = time_launches(backend, inputs, _fresh_out(contract, launch, device), launch.time) if launch.time else None
    return Execution(tuple(outputs), mutated, seconds[0], timing, max(peaks) if peaks else None)


def _peak_reset(device: torch.device) -> int:
    """CUDA: the peak statistic restarted from what is allocated now, and that amount (a launch's own
    peak allocation is then max_memory_allocated less it; the poisoned output it is handed is not counted)."""
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _fresh_out(contract: Contract, launch: Launch, device: torch.device) -> torch.Tensor | None:
    """The poisoned buffer a backend that writes into one is handed; None for the others."""
    if not contract.writes_into_output:
        return None
    return poisoned((launch.rows, launch.max_model_len), contract.output_dtype, device)


def _checked_output(got: object, launch: Launch, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`got` when it is the dense tensor the contract promises: shape [rows, max_model_len], the
    contract's output_dtype (or float64: exact logits, as the reference computes them on the CPU), on
    the inputs' device; ContractViolation (the backend's ERROR) otherwise."""
    shape = (launch.rows, launch.max_model_len)
    dtypes = list(dict.fromkeys((dtype, torch.float64)))
    expected = (f"a dense torch.Tensor of shape [rows, max_model_len] = {list(shape)}, dtype "
                f"{' or '.join(map(str, dtypes))}, on {device}")
    if not isinstance(got, torch.Tensor):
        raise ContractViolation(f"contract: expected {expected}, got {type(got).__name__}")
    actual = f"a {got.layout} tensor of shape {list(got.shape)}, dtype {got.dtype}, on {got.device}"
    if got.layout != torch.strided or tuple(got.shape) != shape or got.dtype not in dtypes or got.device != device:
        raise ContractViolation(f"contract: expected {expected}, got {actual}")
    return got


def _bit_copy(values: torch.Tensor) -> torch.Tensor:
    """A copy of `values`, NaN payloads (the poison) included: copied as integers of the same width."""
    if not values.dtype.is_floating_point:
        return values.clone()
    as_int = INT_OF_SIZE[values.element_size()]
    return values.view(as_int).clone().view(values.dtype)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so errors and timings belong to the call that caused them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_failure(device: torch.device) -> str | None:
    """Why `device` can no longer run work (a sticky CUDA error), or None when it still can."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
    except Exception as exc:  # any failure here means the context is gone
        return f"{type(exc).__name__}: {exc}"
    return None


# --------------------------------------------------------------------------- an operation's call

@dataclasses.dataclass(frozen=True)
class Launches:
    """What a guarded call of an operation's backend made: one output per launch and the inputs written into
    ('logits', 'k_start', 'q (logits stage)'); where a launch's output was not what the contract declares, the
    outputs before it and why (`violation`: the backend's ERROR; no launch after it ran)."""

    outputs: tuple[Any, ...]
    mutated: tuple[str, ...] = ()
    violation: str | None = None


@dataclasses.dataclass(frozen=True)
class GuardedCall:
    """An operation's call (difftest.core.operation.Operation.call) as the engine makes it, in a worker or in this
    process: `repeat` launches on the case, each with every backend the call reaches watched (Watched), each
    output checked against the operation's Expected tensors. `private`: the inputs that share memory with the
    case are copies (in this process the case is the next backend's too; a worker's case is its own)."""

    call: Callable[[Any, Any], Any]
    output: Callable[[Any, Any], tuple[Expected, ...]]
    watched: Callable[[Any, Callable[..., Any]], Any]
    repeat: int = 1
    private: bool = False

    def __call__(self, backend: Any, case: Any) -> Launches:
        """The launches of `backend` on `case`; a backend's exception goes to the caller, as Operation.call's."""
        shared = _storages(case) if self.private else frozenset()
        mutated: dict[str, None] = {}  # insertion-ordered set of the inputs written into

        def watch(inner: Any, writes: tuple[str, ...] = (), stage: str | None = None) -> Watched:
            return Watched(inner, writes, stage, shared, mutated)

        reached = self.watched(backend, watch)
        expected = self.output(case, backend.contract)
        outputs: list[Any] = []
        for _ in range(self.repeat):
            got = self.call(reached, case)
            violation = output_violation(got, expected)
            if violation:
                return Launches(tuple(outputs), tuple(mutated), violation)
            # A backend may hand back the same buffer every launch: keep each launch's bits apart.
            outputs.append(_bit_copied(got) if self.repeat > 1 else got)
        return Launches(tuple(outputs), tuple(mutated))


class Watched:
    """A backend as a guarded call hands it its inputs: the tensor fields of the inputs (those its contract lets
    it write into, `writes`, aside) fingerprinted before and after it runs, a change named in `mutated` (with
    the `stage` of a composition); the float tensors it makes through torch's empty factories poisoned and the
    torch settings it changes put back (as execute does for paged logits); the inputs sharing a storage of
    `shared` (the case's) copied first. Every other attribute is the backend's (contract, name, ...)."""

    def __init__(self, backend: Any, writes: tuple[str, ...], stage: str | None, shared: frozenset[int],
                 mutated: dict[str, None]) -> None:
        self.backend, self.writes, self.stage, self.shared, self.mutated = backend, writes, stage, shared, mutated

    def __getattr__(self, name: str) -> Any:
        if name == "backend":  # not set yet (a copy being made): no recursion through the lookup below
            raise AttributeError(name)
        return getattr(self.backend, name)

    def __call__(self, inputs: Any, out: Any) -> Any:
        """The backend on `inputs` (its private copy), watched."""
        inputs = _private_inputs(inputs, self.shared)
        tensors = {name: t for name, t in _tensor_fields(inputs).items() if name not in self.writes}
        before = tensor_fingerprints(tensors)
        with PoisonFreshTensors(), TorchState.kept():
            got = self.backend(inputs, out)
        after = tensor_fingerprints(tensors)
        for name in before:
            if before[name] != after[name]:
                self.mutated[name if self.stage is None else f"{name} ({self.stage})"] = None
        return got


def output_violation(got: Any, expected: tuple[Expected, ...]) -> str | None:
    """'contract: expected indices: a dense torch.Tensor of shape [4, 8], dtype torch.int32 or torch.int64, on
    cpu, got a strided tensor of shape [4, 8], dtype torch.float32, on cpu' for the first of the `expected`
    tensors `got` is not (a None, a list, another dtype, shape or device); None when it is every one."""
    for tensor in expected:
        value = got if tensor.part is None else getattr(got, tensor.part, None)
        if not isinstance(value, torch.Tensor):
            return f"contract: expected {tensor.describe()}, got {type(value).__name__}"
        if (value.layout != torch.strided or tuple(value.shape) != tensor.shape or value.dtype not in tensor.dtypes
                or value.device.type != tensor.device):
            return (f"contract: expected {tensor.describe()}, got a {value.layout} tensor of shape "
                    f"{list(value.shape)}, dtype {value.dtype}, on {value.device}")
    return None


def logits_expected(output_dtype: torch.dtype, shape: tuple[int, ...], device: str,
                    part: str | None = None) -> Expected:
    """Logits as a contract declares them: its output_dtype, or float64 (exact logits, as the reference computes
    them on the CPU), the rule the paged runner checks (_checked_output)."""
    return Expected("logits", tuple(dict.fromkeys((output_dtype, torch.float64))), shape, device, part)


def _tensor_fields(inputs: Any) -> dict[str, torch.Tensor]:
    """The tensors among the fields of `inputs` (a dataclass: TopkInputs, RaggedInputs, KernelInputs)."""
    if not dataclasses.is_dataclass(inputs):
        return {}
    return {f.name: t for f in dataclasses.fields(inputs) if isinstance(t := getattr(inputs, f.name), torch.Tensor)}


def _storages(case: Any) -> frozenset[int]:
    """Where the tensors of `case` (a dataclass, and the cases it holds: a composition's stage case) live."""
    found: set[int] = set()
    stack = [case]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            found.add(value.untyped_storage().data_ptr())
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            stack += [getattr(value, f.name) for f in dataclasses.fields(value)]
    return frozenset(found)


def _private_inputs(inputs: Any, shared: frozenset[int]) -> Any:
    """`inputs` with each tensor that lives in a storage of `shared` copied, storage and all (a top-k's logits
    are a view of wider rows: their row stride is part of what the kernel is handed)."""
    copies = {name: _storage_copy(t) for name, t in _tensor_fields(inputs).items()
              if t.untyped_storage().data_ptr() in shared}
    return dataclasses.replace(inputs, **copies) if copies else inputs


def _storage_copy(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` over a copy of its whole storage: the same offset, sizes and strides."""
    storage = tensor.untyped_storage().clone()
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(storage, tensor.storage_offset(),
                                                                         tensor.size(), tensor.stride())


def _bit_copied(value: Any) -> Any:
    """`value` with each tensor in it (itself, or a dataclass's fields: a composition's Staged) bit-copied."""
    if isinstance(value, torch.Tensor):
        return _bit_copy(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _bit_copied(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    return value
