"""Graph replay (`difftest run --graph`): a backend's per-layer call captured once, then replayed with new
lengths, block tables and values written into the captured buffers in place, as serving engines run it.

For each case and backend: the case's inputs are encoded at the captured size (its block table as wide
as max_model_len needs: difftest.generators.graph_family.captured), the backend's `prepare` is called once
on them (difftest.backends.base.launcher: what a production caller builds per batch or per capture), and
on CUDA the per-layer call it returns is captured in a torch.cuda.CUDAGraph (warmed up on a side stream
first, as torch documents). Then each replay of the case's family (graph_family.replay_family: lengths
grown past and shrunk below the captured ones, requests made empty, blocks moved, every value fresh) is
copied into the SAME tensors and the graph replayed (CUDA), or the captured call made again without
preparing anew (CPU: what freezing host-side values means there). Each replay's output is judged against
the oracle on that replay's case: a result named `<case>@replay<i>`, a failure a verdict as any other.

What it catches: a schedule or metadata built in `prepare` from the captured lengths and reused after they
changed, and a pointer or size captured by value. A backend without `prepare` is its whole call: on the
CPU, calling it again re-reads everything and so freezes nothing; on CUDA the graph freezes its kernels'
arguments for real. A backend that raises while capturing or replaying is ERROR (each replay's result
says which), and the run goes on. Under isolation each backend's capture and replays run in a worker process
of their own (Replayers: a graph and the buffers it was captured on live in one process), so one that kills
that process or hangs is CRASH or TIMEOUT on each replay of the case, and the run goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from difftest.backends import Loaded, Origin, rebuild
from difftest.backends.base import launcher, rebuilt_every_step
from difftest.core.case import Case
from difftest.core.contract import Contract
from difftest.core.errors import SpecError, exception_text
from difftest.core.kernel_inputs import KernelInputs, encode
from difftest.core.kinds import Isolation, LengthEncoding
from difftest.core.lifetime import run_folder
from difftest.core.memory import ran_out
from difftest.core.poison import poisoned
from difftest.core.verdict import Verdict
from difftest.engine.call import finished, identity, unsupported_reason
from difftest.engine.config import RunConfig
from difftest.engine.guards import (
    INPUT_FIELDS,
    Fault,
    Launch,
    Outcome,
    device_failure,
    execute,
    fill_poison,
    formatted_traceback,
)
from difftest.engine.isolate import DEFAULT_TIMEOUT, Called, InProcess, OperationWorker
from difftest.engine.result import CaseResult
from difftest.generators.graph_family import FAMILY, captured, replay_family
from difftest.oracles.reference import make_reference

WARM_UP = 3  # launches on a side stream before a capture, as torch's CUDA-graph example makes


@dataclasses.dataclass(frozen=True)
class Captured:
    """A backend's call captured on `inputs`: `again` replays it (the graph, or the captured call) and
    returns its output, which each replay overwrites; `outputs` are the buffers it writes (poisoned
    before each replay, so a position left unwritten shows)."""

    inputs: KernelInputs
    again: Callable[[], torch.Tensor]
    outputs: tuple[torch.Tensor, ...]

    def write(self, replay: KernelInputs) -> None:
        """`replay`'s tensors copied into the captured ones, in place."""
        for name in INPUT_FIELDS:
            into = getattr(self.inputs, name)
            if into is not None:
                into.copy_(getattr(replay, name))


@dataclasses.dataclass(frozen=True)
class _ReplayCall:
    """One replay as a call the engine's guards make (difftest.engine.guards.execute): the inputs it is handed
    written into the captured buffers, then the captured call again; a copy of its output returned."""

    name: str
    contract: Contract
    capture: Captured

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        self.capture.write(inputs)
        for buffer in self.capture.outputs:
            fill_poison(buffer)
        got = self.capture.again()
        return got.clone() if isinstance(got, torch.Tensor) else got


class Replayers:
    """Where each backend's graph replays run: under isolation (config.isolated) a worker process per backend
    rebuilt from its origin (difftest.engine.isolate.OperationWorker: started on its first case, replaced after
    it dies or hangs); in this process without isolation, or for a backend nothing rebuilds."""

    def __init__(self, config: RunConfig, log_dir: Path | None) -> None:
        self.config, self.log_dir = config, log_dir
        self.workers: dict[str, OperationWorker] = {}

    def results(self, backend: Loaded, case: Case) -> list[CaseResult]:
        """`backend`'s results on the replays of `case` (on the run's device, validated), in order."""
        if self.log_dir is None or backend.origin.target is None:
            return list(replayed(backend, case, self.config))
        # The capture and every replay of a case in one call: each replay may take what a case may.
        limit = (self.config.timeout or DEFAULT_TIMEOUT) * len(FAMILY)
        worker = self.workers.get(backend.name) or OperationWorker(
            _replayed_by_origin, backend.origin, self.config.device, limit, self.log_dir / str(len(self.workers)),
            self.config.startup_timeout)
        self.workers[backend.name] = worker
        answer = worker(_Job(case, self.config))
        if isinstance(answer, Called):
            return [dataclasses.replace(result, isolation=Isolation.WORKER) for result in answer.output]
        return [_described(CaseResult(verdict=answer.verdict, seconds=answer.seconds, reason=answer.reason,
                                      error_type=answer.error_type, traceback=answer.traceback,
                                      isolation=Isolation.WORKER, **identity(backend, replay, self.config)), replay)
                for replay in replay_family(case)]


@contextlib.contextmanager
def replayers(config: RunConfig) -> Iterator[Replayers | None]:
    """The Replayers of a run with config.graph (None without it), their workers stopped and their logs
    removed when the context ends."""
    if not config.graph:
        yield None
        return
    log_dir = Path(tempfile.mkdtemp(prefix="difftest-graph-", dir=run_folder())) if config.isolated else None
    made = Replayers(config, log_dir)
    try:
        yield made
    except BaseException:  # interrupted (Ctrl-C, an error): a worker may be mid-call
        for worker in made.workers.values():
            worker.kill()
        raise
    else:
        for worker in made.workers.values():
            worker.stop()
    finally:
        if log_dir is not None:
            shutil.rmtree(log_dir, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class _Job:
    """What a replay worker is handed per case: the case, and how the run feeds backends."""

    case: Case
    config: RunConfig

    def to(self, device: str) -> _Job:
        """The job with its case on `device` (how a worker takes a case)."""
        return dataclasses.replace(self, case=self.case.to(device))


def _replayed_by_origin(origin: Origin, job: _Job) -> list[CaseResult]:
    """In a replay worker: the results of the backend `origin` names (built once per process) on `job`."""
    return list(replayed(_rebuilt(origin), job.case, job.config))


@functools.cache
def _rebuilt(origin: Origin) -> Loaded:
    """The backend `origin` names, built once in this process."""
    return rebuild(origin)


def replayed(backend: Loaded, case: Case, config: RunConfig) -> Iterator[CaseResult]:
    """The results of `backend` on each replay of `case`'s family (case on the run's device, validated),
    in order; SKIPs with the reason where the backend cannot take the captured case or its encoding cannot
    be captured, the capture's ERROR (or CRASH) for each replay where capturing failed."""
    inputs = _capturable(backend, captured(case), config)
    if isinstance(inputs, str):
        yield from (_skipped(backend, replay, config, inputs) for replay in replay_family(case))
        return
    capture = capture_call(backend, inputs)
    for replay in replay_family(case):
        yield _described(_judged(backend, replay.validate(), config, capture), replay)


def capture_call(backend: Loaded, inputs: KernelInputs) -> Captured | Fault:
    """`backend`'s per-layer call prepared once on `inputs` and, on CUDA, captured in a CUDA graph; the
    Fault of the exception that stopped it (CRASH where the device is unusable afterwards)."""
    start = time.perf_counter()
    out = _out_buffer(backend.contract, inputs)
    try:
        call = launcher(backend, inputs, out)
        if inputs.q.device.type != "cuda":
            return Captured(inputs, call, () if out is None else (out,))
        graph, static = _graph_of(call, inputs.q.device)
    except Exception as exc:  # the backend's fault: each replay's verdict, never the run's end
        return _capture_fault(exc, inputs.q.device, time.perf_counter() - start)

    def again() -> torch.Tensor:
        graph.replay()
        return static

    buffers = tuple({id(t): t for t in (out, static) if isinstance(t, torch.Tensor)}.values())
    return Captured(inputs, again, buffers)


def _graph_of(call: Callable[[], torch.Tensor], device: torch.device) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`call` captured in a CUDA graph after WARM_UP launches on a side stream, and the output it writes."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARM_UP):
            call()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = call()
    torch.cuda.synchronize(device)
    return graph, static


def _capture_fault(exc: Exception, device: torch.device, seconds: float) -> Fault:
    """The Fault of an exception raised while preparing or capturing."""
    reason = f"capturing the call raised {exception_text(exc)}"
    broken = None if ran_out(exc) else device_failure(device)
    if broken is not None:
        return Fault(Verdict.CRASH, f"{reason} (device unusable afterwards: {broken})", seconds, type(exc).__name__,
                     formatted_traceback(exc))
    return Fault(Verdict.ERROR, reason, seconds, type(exc).__name__, formatted_traceback(exc))


def _judged(backend: Loaded, replay: Case, config: RunConfig, capture: Captured | Fault) -> CaseResult:
    """One replay written into the capture (guarded as every call is: poison, checksums, the output's
    contract) and judged against the oracle on the replay's case; a SKIP where its inputs do not fit the
    captured buffers."""
    base = identity(backend, replay, config)
    if isinstance(capture, Fault):
        outcome: Outcome | CaseResult = capture
    else:
        inputs = _encoded(backend, replay, config)
        misfit = _misfit(capture.inputs, inputs)
        outcome = CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=misfit, **base) if misfit else execute(
            _ReplayCall(backend.name, backend.contract, capture), inputs, Launch(replay.rows, replay.max_model_len))
    return finished(outcome, make_reference(replay, config.oracle_kind), backend, replay, config, InProcess(), base)


def _misfit(captured_inputs: KernelInputs, replay: KernelInputs) -> str | None:
    """Why `replay` cannot be written into the captured buffers (a tensor of another shape or dtype), or None."""
    for name in INPUT_FIELDS:
        into, value = getattr(captured_inputs, name), getattr(replay, name)
        if (into is None) != (value is None):
            return f"its {name} is {'absent' if value is None else 'present'} where the captured call's was not"
        if into is not None and (into.shape != value.shape or into.dtype != value.dtype):
            return (f"its {name} ({list(value.shape)}, {value.dtype}) does not fit the captured buffer "
                    f"({list(into.shape)}, {into.dtype})")
    return None


def _capturable(backend: Loaded, base: Case, config: RunConfig) -> KernelInputs | str:
    """The inputs `backend`'s call on `base` is captured on, or why it cannot be captured and replayed."""
    try:
        reason = unsupported_reason(backend, base, config.device)
    except Exception as exc:  # its own availability check failing: the plain result of the case says so
        return f"unavailable_reason raised {exception_text(exc)}"
    if reason:
        return reason
    rebuilder = rebuilt_every_step(backend)
    if rebuilder:  # a capture's schedule replayed at other lengths is the harness's bug, not the kernel's
        return (f"graph replay: its set-up is rebuilt at every step by {rebuilder}, and --graph keeps the "
                "capture's set-up for every replay (a stale schedule: no verdict the kernel earned)")
    if (config.encoding or backend.contract.length_encoding) == LengthEncoding.PREFIX_SUM:
        return ("graph replay: the prefix-sum encoding's flat token ids are as many as the lengths' sum, so no "
                "buffer captured at one step's lengths holds another's")
    try:
        return _encoded(backend, base, config)
    except SpecError as exc:
        return f"cannot encode: {exc}"


def _encoded(backend: Loaded, case: Case, config: RunConfig) -> KernelInputs:
    """`case` encoded for `backend`, every tensor its own (none shares memory with the case's)."""
    inputs = encode(case, backend.contract, encoding=config.encoding, layout=config.layout)
    fields = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
    return dataclasses.replace(inputs, **{name: t.clone() for name, t in fields.items() if isinstance(t, torch.Tensor)})


def _out_buffer(contract: Contract, inputs: KernelInputs) -> torch.Tensor | None:
    """The poisoned output buffer a backend that writes into one is captured with; None for the others."""
    if not contract.writes_into_output:
        return None
    return poisoned((inputs.rows, inputs.max_model_len), contract.output_dtype, inputs.q.device)


def _skipped(backend: Loaded, replay: Case, config: RunConfig, reason: str) -> CaseResult:
    """A replay's SKIP, with why."""
    return _described(CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=reason,
                                 **identity(backend, replay, config)), replay)


def _described(result: CaseResult, replay: Case) -> CaseResult:
    """`result`, its description saying which replay of which capture it is."""
    step = replay.meta.get("graph_replay", "")
    return dataclasses.replace(result, description=f"graph replay ({step}) of {replay.meta.get('captured')}: "
                               f"{result.description}")

