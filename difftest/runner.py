"""The runner: every case through the oracle once, then through every backend, one verdict each.

A backend that raises gets ERROR and the run goes on; a backend that cannot take a case gets SKIP
with the reason; results reach `on_result` as each one is made, so a report can stream them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

import torch

from difftest.backends import Backend
from difftest.case import Case
from difftest.compare import Comparison, compare
from difftest.contract import CacheLayout, Contract, LengthEncoding
from difftest.encode import KernelInputs, adapt_block_size, encode
from difftest.errors import SpecError
from difftest.poison import poisoned
from difftest.verdict import Verdict
from oracles.paged_mqa_logits import fp32_error_bound, reference


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How backends are fed: the device, and what-if overrides of their declared contract."""

    device: str = "cpu"
    encoding: LengthEncoding | None = None
    layout: CacheLayout | None = None


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
    reason: str | None = None  # the exception of an ERROR, the cause of a SKIP
    spec: dict[str, object] | None = None


@dataclasses.dataclass(frozen=True)
class Reference:
    """The oracle's answer for one case, computed once and shared by every backend."""

    logits: torch.Tensor  # float64 [rows, max_model_len]
    row_lens: torch.Tensor  # (rows,)
    bound: torch.Tensor  # (rows,) float32 rounding bound


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


def run_backend(backend: Backend, case: Case, ref: Reference, config: RunConfig) -> CaseResult:
    """Encode `case` for `backend`, call it, compare; never raises for the backend's faults."""
    contract = backend.contract
    base = dict(backend=backend.name, case=case.name, description=case.describe(), rows=case.rows,
                device=config.device, encoding=(config.encoding or contract.length_encoding).value,
                layout=(config.layout or contract.cache_layout).value,
                overridden=config.encoding is not None or config.layout is not None,
                spec=case.meta.get("spec"))
    reason = unsupported_reason(backend, case, config.device)
    if reason:
        return CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=reason, **base)
    try:
        inputs = encode(case, contract, encoding=config.encoding, layout=config.layout)
    except SpecError as exc:
        return CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=f"cannot encode: {exc}", **base)
    start = time.perf_counter()
    try:
        got = _call(backend, inputs, case)
    except Exception as exc:  # the backend's fault becomes its verdict, never the run's end
        return CaseResult(verdict=Verdict.ERROR, seconds=time.perf_counter() - start,
                          reason=f"{type(exc).__name__}: {exc}", **base)
    seconds = time.perf_counter() - start
    try:
        result = compare(ref.logits, got, ref.row_lens, contract, ref.bound)
    except ValueError as exc:
        return CaseResult(verdict=Verdict.ERROR, seconds=seconds, reason=str(exc), **base)
    return CaseResult(verdict=result.verdict, seconds=seconds, comparison=result, **base)


def _call(backend: Backend, inputs: KernelInputs, case: Case) -> torch.Tensor:
    contract = backend.contract
    out = None
    if contract.writes_into_output:
        out = poisoned((case.rows, case.max_model_len), contract.output_dtype, case.device)
    got = backend(inputs, out)
    if case.device.type == "cuda":
        torch.cuda.synchronize()
    return got


def run(backends: list[Backend], cases: Iterable[Case], config: RunConfig,
        on_result: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Every backend on every case; results in (case, backend) order."""
    results = []
    for case in cases:
        case = case.to(config.device)
        ref = make_reference(case)
        for backend in backends:
            result = run_backend(backend, case, ref, config)
            results.append(result)
            if on_result:
                on_result(result)
    return results
