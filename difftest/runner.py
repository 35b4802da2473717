"""The runner: every case through the oracle once, then through every backend, one verdict each.

A backend that raises gets ERROR and the run goes on; a backend that cannot take a case gets SKIP
with the reason; results reach `on_result` as each one is made, so a report can stream them.
Every call is guarded (difftest.guards): fresh tensors poisoned, inputs checksummed (a write into
them is FAIL(mutated-input)), `repeat` launches compared (FAIL(nondeterministic)). With isolation
(difftest.isolate) each backend runs in a worker process of its own, so a segfault, an abort or a
sticky CUDA error is CRASH and a hang past the timeout is TIMEOUT, and the run goes on; a case is
submitted to every backend's worker before any answer is awaited, so the workers compute side by
side and results still come in backend order. With
`sanitize`, failing results are replayed under compute-sanitizer (difftest.sanitize).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from difftest.backends import Backend
from difftest.case import Case
from difftest.compare import Comparison, compare
from difftest.contract import Contract
from difftest.encode import KernelInputs, adapt_block_size, encode
from difftest.errors import SpecError, require
from difftest.guards import Execution, Fault, Launch, Stability, StabilityKind, classify_stability
from difftest.isolate import Executor, InProcess, WorkerPool, recipe
from difftest.kinds import CacheLayout, LengthEncoding
from difftest.sanitize import TOOLS, SanitizerReport, sanitize
from difftest.verdict import Verdict, worst
from oracles.paged_mqa_logits import fp32_error_bound, reference

DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How backends are fed: the device, what-if overrides of their declared contract, and the guards."""

    device: str = "cpu"
    encoding: LengthEncoding | None = None
    layout: CacheLayout | None = None
    isolate: bool | None = None  # a worker process per backend; None: on for cuda (or a timeout), off for cpu
    timeout: float | None = None  # seconds a case may take in a worker, all launches; None: isolate.DEFAULT_TIMEOUT
    repeat: int = 1  # launches per case; more than one classifies the backend's stability
    sanitize: str | None = None  # a compute-sanitizer tool to replay failing results under
    sanitize_all: bool = False  # replay every result that ran, not only the failing ones

    def __post_init__(self) -> None:
        require(self.device in DEVICES, "device", self.device, f"one of {list(DEVICES)}")
        require(self.encoding is None or isinstance(self.encoding, LengthEncoding), "encoding", self.encoding,
                f"None or a difftest.LengthEncoding {[e.value for e in LengthEncoding]}")
        require(self.layout is None or isinstance(self.layout, CacheLayout), "layout", self.layout,
                f"None or a difftest.CacheLayout {[c.value for c in CacheLayout]}")
        require(self.isolate in (None, True, False), "isolate", self.isolate, "None, True or False")
        require(type(self.repeat) is int and self.repeat >= 1, "repeat", self.repeat, "an integer >= 1")
        require(self.timeout is None or (isinstance(self.timeout, (int, float)) and 0 < self.timeout < math.inf),
                "timeout", self.timeout, "a finite number of seconds > 0")
        require(self.timeout is None or self.isolate is not False, "timeout", self.timeout,
                "isolation (a call is cut short by killing its worker), not isolate=False")
        require(self.sanitize is None or self.sanitize in TOOLS, "sanitize", self.sanitize, f"one of {list(TOOLS)}")
        require(not self.sanitize_all or self.sanitize is not None, "sanitize_all", self.sanitize_all,
                "a sanitize tool to go with it")

    @property
    def isolated(self) -> bool:
        """Whether backends run in worker processes: as asked, else on cuda or with a timeout."""
        if self.isolate is not None:
            return self.isolate
        return self.device == "cuda" or self.timeout is not None


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """One backend on one case."""

    backend: str
    case: str
    description: str
    rows: int
    verdict: Verdict
    device: str
    encoding: str  # the length encoding the backend was handed
    layout: str
    overridden: bool  # True when --encoding/--layout replaced the backend's declared one
    seconds: float
    comparison: Comparison | None = None
    reason: str | None = None  # the exception of an ERROR, CRASH or TIMEOUT, the cause of a SKIP
    spec: dict[str, object] | None = None
    mutated_inputs: tuple[str, ...] = ()  # input tensors the backend wrote into
    stability: Stability | None = None  # how `repeat` launches agreed; None for one launch
    isolation: str | None = None  # "worker" or "in-process: why" when the run asked for isolation
    sanitizer: SanitizerReport | None = None  # the compute-sanitizer replay, when one was asked for
    gpu: str | None = None  # the physical GPU it was computed on (gpu_description); None on the CPU


@dataclasses.dataclass(frozen=True)
class Reference:
    """The oracle's answer for one case, computed once and shared by every backend."""

    logits: torch.Tensor  # float64 [rows, max_model_len]
    row_lens: torch.Tensor  # (rows,)
    bound: torch.Tensor  # (rows,) float32 rounding bound


def gpu_description(device: torch.device) -> str | None:
    """The GPU `device` is, e.g. 'cuda:0 NVIDIA H200 (PCI 0000:19:00.0, CUDA_VISIBLE_DEVICES=3)' (plain
    'cuda': the current one); None on the CPU. Isolated workers inherit CUDA_VISIBLE_DEVICES and compute
    on its first device, as a run that never sets another current device does."""
    if device.type != "cuda":
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    return describe_gpu(index, torch.cuda.get_device_properties(index), os.environ.get("CUDA_VISIBLE_DEVICES"))


def describe_gpu(index: int, props: Any, visible: str | None) -> str:
    """'cuda:{index} {name} (PCI {domain}:{bus}:{slot}.0, CUDA_VISIBLE_DEVICES={visible})' of
    torch.cuda.get_device_properties(index); the UUID where this torch does not expose the PCI address."""
    if hasattr(props, "pci_bus_id"):  # GPUs are PCI function 0
        where = f"PCI {props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    else:
        where = f"UUID {props.uuid}"
    return f"cuda:{index} {props.name} ({where}, CUDA_VISIBLE_DEVICES={'unset' if visible is None else visible})"


def make_reference(case: Case) -> Reference:
    """Oracle logits in float64 on the case's device, the limits, and the fp32 error bound."""
    q, k = case.q_values(), case.k_values()
    bound = fp32_error_bound(q, k, case.scale_pool, case.weights, case.block_table, case.row_lens())
    return Reference(reference(case), case.row_lens().reshape(-1), bound)


def unsupported_reason(backend: Backend, case: Case, device: str) -> str | None:
    """Why `backend` cannot take `case` on `device`, or None."""
    reason = backend.unavailable_reason(device)
    if reason:
        return reason
    return _contract_reason(backend.contract, case, device)


def _contract_reason(contract: Contract, case: Case, device: str) -> str | None:
    if device not in contract.devices:
        return f"contract devices {list(contract.devices)} exclude {device}"
    if contract.archs is not None and device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        if f"sm{major}{minor}" not in contract.archs:
            return f"contract archs {list(contract.archs)} exclude sm{major}{minor}"
    checks = [("next_n", case.next_n, contract.next_n), ("head_dim", case.head_dim, contract.head_dims)]
    for field, value, allowed in checks:
        if allowed is not None and value not in allowed:
            return f"contract {field} {list(allowed)} excludes {value}"
    if case.heads % contract.heads_multiple_of:
        return f"heads={case.heads} is not a multiple of {contract.heads_multiple_of}"
    if contract.heads_power_of_two and case.heads & (case.heads - 1):
        return f"heads={case.heads} is not a power of two"
    try:
        adapt_block_size(case, contract)
    except SpecError as exc:
        return f"contract: {exc}"
    return None


def run_backend(backend: Backend, case: Case, ref: Reference, config: RunConfig,
                executor: Executor | None = None) -> CaseResult:
    """Encode `case` for `backend`, call it (in-process unless `executor` says where), compare;
    never raises for the backend's faults."""
    return start_backend(backend, case, ref, config, executor or InProcess())()


def start_backend(backend: Backend, case: Case, ref: Reference, config: RunConfig,
                  executor: Executor) -> Callable[[], CaseResult]:
    """run_backend in two halves: this one encodes and submits the call to `executor`; the function
    it returns waits for the outcome and judges it. Calls to different worker processes overlap."""
    contract = backend.contract
    base = dict(backend=backend.name, case=case.name, description=case.describe(), rows=case.rows,
                device=config.device, encoding=(config.encoding or contract.length_encoding).value,
                layout=(config.layout or contract.cache_layout).value,
                overridden=config.encoding is not None or config.layout is not None,
                spec=case.meta.get("spec"), gpu=gpu_description(case.device))
    reason = unsupported_reason(backend, case, config.device)
    if reason:
        skipped = CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=reason, **base)
        return lambda: skipped
    try:
        inputs = encode(case, contract, encoding=config.encoding, layout=config.layout)
    except SpecError as exc:
        unencodable = CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=f"cannot encode: {exc}", **base)
        return lambda: unencodable
    # The case's own tensors must not be the ones handed over: a backend that writes into them
    # would change the case under every backend after it.
    pending = executor.submit(backend, _private(inputs, case), Launch(case.rows, case.max_model_len, config.repeat))

    def finish() -> CaseResult:
        outcome = pending()
        done = {**base, "isolation": executor.note}
        if isinstance(outcome, Fault):
            return CaseResult(verdict=outcome.verdict, seconds=outcome.seconds, reason=outcome.reason, **done)
        return _judge(outcome, ref, contract, done)

    return finish


def _private(inputs: KernelInputs, case: Case) -> KernelInputs:
    """`inputs` with every tensor that shares memory with the case's tensors cloned."""
    shared = {t.untyped_storage().data_ptr() for t in vars(case).values() if isinstance(t, torch.Tensor)}
    fields = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
    return dataclasses.replace(inputs, **{
        name: t.clone() for name, t in fields.items()
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in shared})


def _judge(execution: Execution, ref: Reference, contract: Contract, base: dict[str, Any]) -> CaseResult:
    """The verdict of an execution: the first launch's comparison, the inputs, the launches' agreement."""
    got = execution.outputs[0]
    measured = {"mutated_inputs": execution.mutated, "seconds": execution.seconds}
    try:
        result = compare(ref.logits, got, ref.row_lens, contract, ref.bound)
    except ValueError as exc:
        return CaseResult(verdict=Verdict.ERROR, reason=str(exc), **measured, **base)
    verdicts = [result.verdict] + ([Verdict.FAIL_MUTATED_INPUT] if execution.mutated else [])
    stability = None
    if len(execution.outputs) > 1:
        stability = classify_stability(execution.outputs, ref.logits, ref.row_lens, contract, ref.bound)
        if stability.kind == StabilityKind.UNSTABLE:
            verdicts.append(Verdict.FAIL_NONDETERMINISTIC)
    return CaseResult(verdict=worst(verdicts), comparison=result, stability=stability, **measured, **base)


def run(backends: list[Backend], cases: Iterable[Case], config: RunConfig,
        on_result: Callable[[CaseResult], None] | None = None,
        done: Mapping[tuple[str, str], CaseResult] | None = None,
        targets: Mapping[str, str] | None = None) -> list[CaseResult]:
    """Every backend on every case; results in (case, backend) order.

    `done` maps (backend name, case name) to results kept from an earlier run (--resume): those
    pairs are not run again and do not reach `on_result`; their results take their place in the list.
    `targets` maps a backend name to the 'package.module:object' it was loaded from, which its
    worker (and a sanitizer replay) rebuilds it from; without one, its own class or function is used.
    """
    _check_run(backends, config)
    done, targets = done or {}, targets or {}
    results: list[CaseResult] = []
    with _executors(backends, config, targets) as executors:
        for case in cases:
            results += _run_case(backends, executors, case, config, on_result, done, targets)
    return results


def _run_case(backends: list[Backend], executors: list[Executor], case: Case, config: RunConfig,
              on_result: Callable[[CaseResult], None] | None, done: Mapping[tuple[str, str], CaseResult],
              targets: Mapping[str, str]) -> list[CaseResult]:
    if not isinstance(case, Case):
        raise SpecError("cases", type(case).__name__, "difftest.Case objects")
    todo = [i for i, b in enumerate(backends) if (b.name, case.name) not in done]
    fresh: dict[int, CaseResult] = {}
    if todo:
        case = case.validate().to(config.device)
        ref = make_reference(case)
        # Every backend's call is submitted before any is waited for: workers compute side by side.
        started = {index: start_backend(backends[index], case, ref, config, executors[index]) for index in todo}
        for index in todo:
            backend = backends[index]
            fresh[index] = _sanitized(started[index](), backend, case, config, targets.get(backend.name))
            if on_result:
                on_result(fresh[index])
    return [fresh[i] if i in fresh else done[(b.name, case.name)] for i, b in enumerate(backends)]


def _check_run(backends: list[Backend], config: RunConfig) -> None:
    """SpecError for a backend that is not one, or a device this machine does not have."""
    for index, backend in enumerate(backends):
        require(isinstance(backend, Backend) and not isinstance(backend, type), f"backends[{index}]", backend,
                "a Backend instance (name, contract, unavailable_reason, __call__); difftest.load_backend "
                "makes one of a class, a factory or a decorated function")
        require(isinstance(backend.contract, Contract), f"backends[{index}].contract", backend.contract,
                "a difftest.Contract")
    require(config.device != "cuda" or torch.cuda.is_available(), "device", config.device,
            "a device torch can see (torch.cuda.is_available() is False)")


@contextlib.contextmanager
def _executors(backends: list[Backend], config: RunConfig, targets: Mapping[str, str]) -> Iterator[list[Executor]]:
    """Where each backend runs: its own worker under isolation, this process otherwise."""
    if not config.isolated:
        yield [InProcess() for _ in backends]
        return
    with WorkerPool(backends, config.device, config.timeout, targets) as pool:
        yield pool.executors


def _sanitized(result: CaseResult, backend: Backend, case: Case, config: RunConfig,
               hint: str | None) -> CaseResult:
    """`result` with its compute-sanitizer replay attached, when the run asks for one."""
    tool = config.sanitize
    if tool is None or result.verdict == Verdict.SKIP or not (result.verdict.failed or config.sanitize_all):
        return result
    if result.verdict == Verdict.TIMEOUT:
        report = SanitizerReport(tool, ran=False, reason="the call timed out; under the sanitizer it would run "
                                 "longer still")
        return dataclasses.replace(result, sanitizer=report)
    target, _why = recipe(backend, hint)
    report = sanitize(tool, case, result, config, target, backend.contract.library)
    verdict = worst([result.verdict, Verdict.FAIL_SANITIZER]) if report.errors else result.verdict
    return dataclasses.replace(result, sanitizer=report, verdict=verdict)
