"""The paged MQA logits operation (decode): the engine's first operation. Its runs go through the engine's own
runner (difftest.engine.runner: batches, the memory model, worker isolation, stability, timing) and its own
fuzz and shrink workflows; the functions here are what the generic operation runner needs, so a paged case
runs there too with the same verdict (tests/difftest/operations/test_paged.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from difftest.backends.registry import builtin_backends
from difftest.core.case import Case
from difftest.core.contract import Contract
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import CaseKind, Device, Headline, OperationKind, OracleKind
from difftest.core.operation import Expected, Operation, Planned
from difftest.core.poison import poisoned
from difftest.core.spec import CaseSpec, case_name
from difftest.engine.comparison import compare
from difftest.engine.guards import logits_expected
from difftest.engine.plan import SuiteRequest, plan
from difftest.engine.result import Judgement
from difftest.engine.stability import Stability, classify_stability
from difftest.generators.envelope import Target, envelope_specs
from difftest.generators.tensors import build_case
from difftest.oracles.reference import Reference, make_reference


def suite() -> list[CaseSpec]:
    """The fixed toy-shape suite's specs (random and edges)."""
    return list(dict.fromkeys(c.spec for c in plan(SuiteRequest(cases=CaseKind.ALL, count=1))))


def envelope(contract: Contract, device: str) -> list[Planned]:
    """The envelope specs of the contract on this device (difftest.generators.envelope)."""
    planned, _ = envelope_specs(contract, Target.probe(Device(device)))
    return [Planned(p.spec, tuple(f.value for f in p.families)) for p in planned]


def reference(case: Case, contract: Contract, oracle: OracleKind) -> Reference:
    """The oracle's logits and bounds (one answer for every contract)."""
    return make_reference(case, oracle)


def call(backend: Any, case: Case) -> Any:
    """The backend on the case as its contract declares, into a poisoned buffer when it writes into one."""
    contract = backend.contract
    inputs = encode(case, contract)
    out = poisoned((case.rows, case.max_model_len), contract.output_dtype, case.device) \
        if contract.writes_into_output else None
    return backend(inputs, out)


def output(case: Case, contract: Contract) -> tuple[Expected, ...]:
    """Logits [rows, max_model_len] of the contract's output_dtype (or float64), on the case's device."""
    return (logits_expected(contract.output_dtype, (case.rows, case.max_model_len), case.device.type),)


def stability(ref: Reference, outputs: tuple[Any, ...], case: Case, contract: Contract) -> Stability:
    """The launches' values against the first's, within the comparison's tolerance."""
    return classify_stability(outputs, ref.logits, ref.row_lens, contract, ref.bound)


def watched(backend: Any, watch: Callable[..., Any]) -> Any:
    """The backend itself: its inputs are all read-only."""
    return watch(backend)


def judge(ref: Reference, got: Any, case: Case, contract: Contract) -> Judgement:
    """The paged comparison, the wrong -inf mask its headline."""
    if tuple(got.shape) != (case.rows, case.max_model_len):
        raise ValueError(f"backend returned logits of shape {tuple(got.shape)}, expected "
                         f"{(case.rows, case.max_model_len)}")
    judged = compare(ref.logits, got, ref.row_lens, contract, bound=ref.bound, next_n=case.next_n)
    return Judgement(judged.verdict, f"{len(judged.mask_rows)}/{judged.rows} rows with the wrong -inf mask",
                     comparison=judged)


PAGED_LOGITS = Operation(
    kind=OperationKind.PAGED_LOGITS, summary="decode: fp8 MQA logits over a paged KV cache",
    headlines=(Headline.MASK,), case_type=Case, spec_type=CaseSpec, contract_type=Contract,
    backends=builtin_backends, suite=suite, envelope=envelope, random_spec=None, build=build_case,
    case_name=case_name, load_case=Case.load, reference=reference, call=call, judge=judge, shrink=None, relate=None,
    output=output, stability=stability, watched=watched)
