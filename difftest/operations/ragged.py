"""The ragged (prefill) MQA logits operation: q [rows, H, D] against each query's key window of a contiguous
key buffer (difftest.core.ragged), judged row by row like paged logits, the wrong -inf mask the headline; its
metamorphic relations in difftest.engine.ragged_metamorphic."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from difftest.backends.stages import ragged_backends
from difftest.core.kinds import Device, Headline, OperationKind, OracleKind
from difftest.core.operation import Expected, Operation, Planned
from difftest.core.poison import poisoned
from difftest.core.ragged import RaggedCase, RaggedContract, encode_ragged
from difftest.engine.guards import logits_expected
from difftest.engine.ragged_comparison import compare_ragged
from difftest.engine.ragged_metamorphic import relate
from difftest.engine.result import Judgement
from difftest.engine.stability import ragged_stability
from difftest.generators.envelope import Target
from difftest.generators.ragged import (
    RaggedPlanned,
    RaggedSpec,
    RaggedWindows,
    build_ragged_case,
    default_ragged_specs,
    ragged_case_name,
    ragged_plan,
)
from difftest.generators.ragged_shrink import shrink_ragged
from difftest.oracles.ragged_reference import RaggedReference, make_ragged_reference


def envelope(contract: RaggedContract, device: str) -> list[Planned]:
    """The specs of ragged_plan (every edge family of the contract's tiles) on this device's scale."""
    return [Planned(item.spec, tuple(f.value for f in item.families))
            for item in ragged_plan(contract, Target.probe(Device(device))) if isinstance(item, RaggedPlanned)]


def random_spec(rng: random.Random, device: str) -> RaggedSpec:
    """A small spec of drawn windows, staircase or whole-buffer rows, at H 16..64 and D 32..128."""
    windows = rng.choice(list(RaggedWindows))
    rows = rng.randint(1, 24)
    return RaggedSpec(name=f"fuzz-{windows.value}", rows=rows, keys=rng.randint(rows, 600),
                      heads=rng.choice((16, 32, 64)), head_dim=rng.choice((32, 64, 128)), windows=windows,
                      requests=rng.randint(1, min(3, rows)))


def reference(case: RaggedCase, contract: RaggedContract, oracle: OracleKind) -> RaggedReference:
    """The oracle's window-relative logits at the contract's output width."""
    return make_ragged_reference(case, contract.width(case), oracle)


def call(backend: Any, case: RaggedCase) -> Any:
    """The backend on the case as its contract's caller hands it (encode_ragged), into a poisoned buffer of its
    output's shape when it writes into one (contract.writes_into_output), as a paged backend is."""
    contract = backend.contract
    out = poisoned((case.rows, contract.width(case)), contract.output_dtype, case.device) \
        if contract.writes_into_output else None
    return backend(encode_ragged(case, contract), out)


def judge(ref: RaggedReference, got: Any, case: RaggedCase, contract: RaggedContract) -> Judgement:
    """The ragged comparison: the paged rules in the window-relative frame."""
    judged = compare_ragged(ref, got, case, contract)
    return Judgement(judged.verdict, judged.headline(), comparison=judged.comparison)


def output(case: RaggedCase, contract: RaggedContract) -> tuple[Expected, ...]:
    """Logits [rows, the contract's width] of its output_dtype (or float64), on the case's device."""
    return (logits_expected(contract.output_dtype, (case.rows, contract.width(case)), case.device.type),)


def watched(backend: Any, watch: Callable[..., Any]) -> Any:
    """The backend itself: q, k, k_scale, weights and the windows are all read-only."""
    return watch(backend)


def shrink(case: RaggedCase, still_fails: Any, contract: RaggedContract, seconds: float) -> RaggedCase:
    """Fewer rows, fewer keys, smaller windows, simpler values (difftest.generators.ragged_shrink)."""
    return shrink_ragged(case, still_fails, contract, seconds).case


RAGGED_LOGITS = Operation(
    kind=OperationKind.RAGGED_LOGITS, summary="prefill: fp8 MQA logits over each query's key window",
    headlines=(Headline.MASK,), case_type=RaggedCase, spec_type=RaggedSpec, contract_type=RaggedContract,
    backends=ragged_backends, suite=default_ragged_specs, envelope=envelope, random_spec=random_spec,
    build=build_ragged_case, case_name=ragged_case_name, load_case=RaggedCase.load, reference=reference,
    call=call, judge=judge, shrink=shrink, relate=relate,
    output=output, stability=ragged_stability, watched=watched)
