"""RaggedSpec (JSON, one-line errors), build_ragged_case (seeded; the staircase rule; canaries), the families a
contract's facts give at each scale, and every planted bug caught on its family and shrunk."""

from __future__ import annotations

import math

import pytest
import torch

from difftest.backends.deep_gemm_ragged import contract as deep_gemm_contract
from difftest.core.errors import SpecError
from difftest.core.kinds import Fp8Flavour, LogitsForm, MaskConvention
from difftest.core.poison import poisoned
from difftest.core.ragged import RaggedCase, RaggedContract, encode_ragged
from difftest.core.spec import Values
from difftest.core.verdict import Verdict
from difftest.engine.ragged_comparison import RaggedComparison, compare_ragged
from difftest.generators.envelope import Target
from difftest.generators.ragged import (
    PRODUCTION_KEYS,
    TWO_31,
    RaggedFamily,
    RaggedOmission,
    RaggedPlanned,
    RaggedSpec,
    RaggedWindows,
    build_ragged_case,
    default_ragged_specs,
    footprint,
    ragged_plan,
    staircase,
)
from difftest.generators.ragged_shrink import shrink_ragged
from difftest.oracles.ragged_reference import make_ragged_reference
from tests.planted_ragged import PLANTED, WRAP_BYTES, Planted, wrapped_keys

ANY = RaggedContract(LogitsForm.ABSOLUTE, MaskConvention.TAIL_NEG_INF)
DEEPGEMM = deep_gemm_contract("deep_gemm (not loaded: facts only)")
PRODUCTION = Target.production_gpu(132, 130 << 30)


def test_json_round_trip_and_errors():
    spec = RaggedSpec(name="x", rows=5, keys=30, windows=RaggedWindows.STAIRCASE, contexts=(3, 4), query_lens=(2, 3),
                      values=Values.HEAVY, fp8=Fp8Flavour.E4M3FNUZ, max_seqlen_k=9, canaries=False)
    assert RaggedSpec.from_json(spec.to_json()) == spec
    for data, field in (({"rows": "3"}, "rows"), ({"starts": [1, -2]}, "starts[1]"), ({"colour": 1}, "colour"),
                        ({"rows": 2, "starts": [0, 1], "ends": [1]}, "starts"), ({"head_dim": 24}, "head_dim"),
                        ({"rows": 2, "keys": 5, "starts": [0, 4], "ends": [3, 6]}, "ends"),
                        ({"windows": "staircase", "rows": 3, "contexts": [1], "query_lens": [2]}, "query_lens"),
                        ({"windows": "staircase", "rows": 3, "keys": 4, "contexts": [5], "query_lens": [3]},
                         "contexts"),
                        ({"contexts": [1], "query_lens": [8]}, "windows"), ({"values": "odd"}, "values")):
        with pytest.raises(SpecError) as info:
            RaggedSpec.from_json(data)
        assert field in str(info.value) and "\n" not in str(info.value), (data, info.value)


def test_same_seed_same_tensors_and_the_seed_matters():
    spec = default_ragged_specs()[0]
    a, b, c = build_ragged_case(spec, 4), build_ragged_case(spec, 4), build_ragged_case(spec, 5)
    assert torch.equal(a.k, b.k) and torch.equal(a.k_end, b.k_end) and torch.equal(a.weights, b.weights)
    assert not torch.equal(a.k_end, c.k_end)
    assert a.name == "random-windows-s4" and a.meta == {"seed": 4, "spec": spec.to_json()}


def test_the_staircase_of_chunked_prefill():
    starts, ends = staircase(torch.tensor([3, 0, 5]), torch.tensor([2, 1, 3]))
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == \
        [(0, 4), (0, 5), (5, 6), (6, 12), (6, 13), (6, 14)]
    drawn = build_ragged_case(RaggedSpec(rows=9, keys=40, windows=RaggedWindows.STAIRCASE, requests=3), 7)
    lens = drawn.window_lens()
    same = drawn.k_start[1:] == drawn.k_start[:-1]
    assert bool(((lens[1:] - lens[:-1] == 1) | ~same).all()), "each row of a request sees one key more"
    assert len(set(drawn.k_start.tolist())) == 3 and int(drawn.k_end[-1]) == 40, "three requests filling the buffer"


def test_keys_no_window_holds_are_canaries():
    case = build_ragged_case(RaggedSpec(rows=2, keys=30, starts=(0, 20), ends=(5, 25)), 0)
    unread = ~case.covered()
    assert torch.isnan(case.k_scale[unread]).all() and (case.k[unread] == 0x7F).all()
    assert torch.isfinite(case.k_scale[~unread]).all()
    plain = build_ragged_case(RaggedSpec(rows=2, keys=30, starts=(0, 20), ends=(5, 25), canaries=False), 0)
    assert torch.isfinite(plain.k_scale).all()
    fnuz = build_ragged_case(RaggedSpec(rows=2, keys=30, starts=(0, 20), ends=(5, 25), fp8=Fp8Flavour.E4M3FNUZ), 0)
    assert (fnuz.k[unread] == 0x80).all() and torch.equal(fnuz.q_values(), case.q_values())


def _names(plan: list) -> dict[str, RaggedPlanned | RaggedOmission]:
    return {(p.spec.name if isinstance(p, RaggedPlanned) else f"omit:{p.family.value}:{p.spec_name}"): p for p in plan}


def test_plan_covers_every_family_and_omits_by_scale():
    for target in (Target.small_cpu(), PRODUCTION):
        plan = ragged_plan(ANY, target)
        reached = {f for p in plan if isinstance(p, RaggedPlanned) for f in p.families}
        omitted = {p.family for p in plan if isinstance(p, RaggedOmission)}
        assert reached | omitted == set(RaggedFamily), set(RaggedFamily) - reached - omitted
    small = ragged_plan(ANY, Target.small_cpu())
    omitted = {p.family: p.reason for p in small if isinstance(p, RaggedOmission)}
    assert set(omitted) == {RaggedFamily.PRODUCTION, RaggedFamily.KEYS_2_31_BYTES, RaggedFamily.LOGITS_2_31_ELEMENTS}
    assert "33554432 keys of 64 bytes" in omitted[RaggedFamily.KEYS_2_31_BYTES]
    for planned in small:
        if isinstance(planned, RaggedPlanned):
            build_ragged_case(planned.spec, 0)  # every small spec builds


def test_plan_follows_deepgemms_facts():
    """Its tiles (64 and 256 keys), its q blocks (128 / H rows), its heads and head dims, and its window-relative
    rows: the windows past max_seqlen_k are its omission, with the reason."""
    plan = _names(ragged_plan(DEEPGEMM, Target.small_cpu()))
    assert {"tile-64-ends", "tile-256-ends", "rows-5", "rows-7", "heads-64", "head-dim-32", "head-dim-128"} <= set(plan)
    long = plan["omit:long-windows:windows-past-max-seqlen-k"]
    assert "longer than max_seqlen_k = 64" in long.reason
    ends = plan["tile-256-ends"].spec
    assert {e - s for s, e in zip(ends.starts, ends.ends, strict=True)} == {255, 256, 257, 511, 512, 513}
    assert set(ends.starts) == {0, 3} and ends.keys == 518, "the buffer is no tile's multiple"
    assert all(p.spec.heads in (32, 64) for p in plan.values() if isinstance(p, RaggedPlanned))


def test_production_plan_reaches_the_2_31_families_without_building_them():
    plan = _names(ragged_plan(DEEPGEMM, PRODUCTION))
    keys_spec = plan["keys-past-2^31-bytes"].spec
    boundary = TWO_31 // keys_spec.head_dim
    assert keys_spec.keys * keys_spec.head_dim > TWO_31
    assert any(s < boundary < e for s, e in zip(keys_spec.starts, keys_spec.ends, strict=True))
    logits = plan["logits-past-2^31-elements"].spec
    assert logits.rows * logits.width(LogitsForm.WINDOW_RELATIVE) > TWO_31 and logits.max_seqlen_k == PRODUCTION_KEYS
    assert logits.ends[-3] - logits.starts[-3] == PRODUCTION_KEYS, "a last row reads the whole width"
    chunk = plan["production-staircase"].spec
    assert (chunk.rows, chunk.keys, chunk.heads, chunk.head_dim) == (16384, 131072, 64, 128)
    tight = _names(ragged_plan(DEEPGEMM, Target.production_gpu(132, 8 << 30)))
    assert "needs" in tight["omit:logits-2^31-elements:logits-past-2^31-elements"].reason
    assert footprint(logits, DEEPGEMM) > 8 << 30


def test_the_int32_offset_bug_needs_production_scale():
    """Plan-only: the small plan leaves keys past 2^31 bytes out with its numbers; the production plan's windows
    hold keys whose int32 byte offset wraps to another key, which the planted kernel then reads."""
    small = _names(ragged_plan(ANY, Target.small_cpu()))
    assert any(name.startswith("omit:keys-2^31-bytes") for name in small)
    spec = _names(ragged_plan(ANY, PRODUCTION))["keys-past-2^31-bytes"].spec
    held = torch.cat([torch.arange(s, e) for s, e in zip(spec.starts, spec.ends, strict=True)])
    read = wrapped_keys(spec.keys, spec.head_dim, WRAP_BYTES)[held]
    assert int((read != held).sum()) > 100, "keys past the boundary are read from the buffer's start"
    assert bool((read[held < TWO_31 // spec.head_dim] == held[held < TWO_31 // spec.head_dim]).all())


KINDS = {Verdict.FAIL_MASK: "mask_rows", Verdict.FAIL_VALUE: "value_rows", Verdict.FAIL_NAN: "nan_rows",
         Verdict.FAIL_UNWRITTEN: "unwritten_rows"}


def judged(backend: Planted, case: RaggedCase) -> RaggedComparison:
    contract = backend.contract
    shape = (case.rows, contract.width(case))
    out = poisoned(shape, torch.float32, "cpu") if contract.writes_into_output else None
    got = backend(encode_ragged(case, contract), out)
    return compare_ragged(make_ragged_reference(case, contract.width(case)), got, case, contract)


SHRINK_PROBES = 2000  # every planted bug's shrink ends within it (planted-offset-wrap-2^14's, the longest, in 484)


@pytest.mark.parametrize(("backend", "family", "verdict"), PLANTED, ids=[p[0].name for p in PLANTED])
def test_planted_bug_is_caught_on_its_family_and_shrunk(backend, family, verdict):
    plan = _names(ragged_plan(backend.contract, Target.small_cpu()))
    case = build_ragged_case(plan[family].spec, 0)
    result = judged(backend, case)
    if verdict == Verdict.PASS:
        assert result.verdict == Verdict.PASS, result.headline()
        return

    def shows(candidate: RaggedCase) -> bool:  # some row shows the planted kind of failure
        return bool(getattr(judged(backend, candidate).comparison, KINDS[verdict]))

    assert shows(case), result.headline()
    # Bounded by probes, not seconds: the same case on a loaded machine as on an idle one.
    shrunk = shrink_ragged(case, shows, backend.contract, budget_seconds=math.inf, max_probes=SHRINK_PROBES)
    small = shrunk.case
    assert shows(small) and shrunk.finished, shrunk
    assert small.rows <= min(3, case.rows) and small.keys < case.keys, small.describe()
    assert small.name == f"{case.name}-min"
