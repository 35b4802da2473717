"""The ragged (prefill) logits mutants: the two that must pass are right on every case of the small ragged plan
(the rotated head sum moving bits from launch to launch), each other one is wrong on the family its catalogue entry
names, the production-only ones are the correct kernel below their scale (and wrap where their scale begins), and
the tile bug is AITER 0.1.7.post2.dev18's, row for row."""

from __future__ import annotations

import pytest
import torch

from difftest.backends import mutants, ragged_mutants
from difftest.backends.aiter_ragged import AiterRagged
from difftest.backends.ragged_mutants import RaggedMutation
from difftest.core.kinds import OperationKind, OracleKind
from difftest.core.ragged import RaggedCase, encode_ragged
from difftest.core.verdict import Verdict
from difftest.generators.envelope import Target
from difftest.generators.ragged import RaggedPlanned, RaggedSpec, build_ragged_case, ragged_plan
from difftest.operations.ragged import RAGGED_LOGITS

CONTRACT = ragged_mutants.contract()
PLAN = [p for p in ragged_plan(CONTRACT, Target.small_cpu()) if isinstance(p, RaggedPlanned)]
SPECS = [s for s in mutants.CATALOGUE if s.operation == OperationKind.RAGGED_LOGITS]


@pytest.fixture(scope="module")
def cases() -> list[tuple[RaggedPlanned, RaggedCase]]:
    return [(planned, build_ragged_case(planned.spec, 0)) for planned in PLAN]


def _verdict(kernel: ragged_mutants.RaggedMutant, case: RaggedCase) -> Verdict:
    reference = RAGGED_LOGITS.reference(case, kernel.contract, OracleKind.EXACT)
    return RAGGED_LOGITS.judge(reference, RAGGED_LOGITS.call(kernel, case), case, kernel.contract).verdict


def test_every_mutation_has_one_entry_of_the_ragged_operation():
    assert sorted(s.mutation.value for s in SPECS) == sorted(m.value for m in RaggedMutation)
    assert all(s.key.startswith("ragged_") and s.name.startswith("mutant-ragged-") for s in SPECS)
    assert mutants.ragged_mutant("ragged_correct").contract == CONTRACT
    with pytest.raises(ValueError, match="mutants='correct': expected one of \\['ragged_correct'"):
        mutants.ragged_mutant("correct")


@pytest.mark.parametrize("key", ["ragged_correct", "ragged_rotated_head_sum"])
def test_the_ragged_mutants_that_must_pass_pass_every_planned_case_every_launch(key, cases):
    kernel = mutants.ragged_mutant(key)
    for planned, case in cases:
        assert [_verdict(kernel, case) for _ in range(2)] == [Verdict.PASS] * 2, planned.spec.name


def test_the_rotated_head_sum_moves_bits_from_launch_to_launch(cases):
    kernel = mutants.ragged_mutant("ragged_rotated_head_sum")
    inputs = encode_ragged(dict(cases)[PLAN[0]], kernel.contract)
    first, second = kernel(inputs, None), kernel(inputs, None)
    finite = torch.isfinite(first)
    assert torch.equal(finite, torch.isfinite(second)) and not torch.equal(first[finite], second[finite])


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.must_pass and not s.production_only], ids=lambda s: s.key)
def test_each_ragged_bug_shows_on_the_family_its_entry_names(spec, cases):
    family = [(planned, case) for planned, case in cases if spec.caught_by in planned.families]
    assert family, spec.caught_by
    verdicts = [_verdict(mutants.ragged_mutant(spec.key), case) for _planned, case in family]
    assert any(v.failed for v in verdicts), verdicts


@pytest.mark.parametrize("spec", [s for s in SPECS if s.production_only], ids=lambda s: s.key)
def test_a_production_only_ragged_mutant_is_right_below_its_scale_and_its_family_is_planned_on_a_gpu(spec, cases):
    """Below 2^31 bytes of keys and 2^31 logits it is the correct kernel; the production plan of an H200 holds a
    case of its family."""
    kernel = mutants.ragged_mutant(spec.key)
    assert [_verdict(kernel, case) for _planned, case in cases] == [Verdict.PASS] * len(cases)
    production = ragged_plan(CONTRACT, Target.production_gpu(132, 140 << 30))
    assert any(isinstance(p, RaggedPlanned) and spec.caught_by in p.families for p in production)


@pytest.mark.parametrize("key, verdict", [("ragged_key_offset_int32", Verdict.FAIL_NAN),
                                          ("ragged_row_offset_int32", Verdict.FAIL_MASK)])
def test_the_32_bit_wrap_is_live_where_its_boundary_is(key, verdict, monkeypatch):
    """With the int32 boundary moved down to 2^13 (keys past key 128 at D 64, logits past row 31 at 256 keys), the
    same index arithmetic wraps on a small case: keys read from a negative offset are NaN, rows stored at one are
    never written."""
    monkeypatch.setattr(ragged_mutants, "TWO_31", 2 ** 13)
    monkeypatch.setattr(ragged_mutants, "TWO_32", 2 ** 14)
    case = build_ragged_case(RaggedSpec(rows=40, keys=256, heads=16, head_dim=64), 3)
    assert _verdict(mutants.ragged_mutant(key), case) == verdict
    assert _verdict(mutants.ragged_mutant("ragged_correct"), case) == Verdict.PASS


def test_rows_taken_a_few_at_a_time_give_the_same_logits(monkeypatch, cases):
    """The row chunks bound memory (a 128K-key prefill); they do not change a bit."""
    kernel = mutants.ragged_mutant("ragged_buffer_end_unmasked")  # its stores past the row included
    inputs = encode_ragged(next(case for planned, case in cases if planned.spec.name == "buffer-end"), CONTRACT)
    whole = kernel(inputs, None)
    monkeypatch.setattr(ragged_mutants, "STEP_BYTES", ragged_mutants.TILE * inputs.k.shape[1] * 4)  # one row a step
    assert torch.equal(kernel(inputs, None).view(torch.int32), whole.view(torch.int32))


WINDOWS = [(3, 130, 400), (3, 260, 262), (130, 259, 259), (1, 2, 2), (0, 127, 200), (5, 40, 300), (200, 390, 390)]


@pytest.mark.parametrize("start, end, keys", WINDOWS)
def test_the_tile_mutant_is_aiter_0_1_7s_window_bug(start, end, keys):
    """One row (no neighbour to spill into): the same -inf and NaN positions as the pinned AITER kernel under the
    Triton interpreter (docs/findings/aiter-triton-ragged-window.md), and the same values where both are finite."""
    aiter = AiterRagged()
    if aiter.unavailable_reason("cpu") or "0.1.7.post2.dev18" not in aiter.contract.library:
        pytest.skip(f"needs amd-aiter 0.1.7.post2.dev18: {aiter.unavailable_reason('cpu')} {aiter.contract.library}")
    case = build_ragged_case(RaggedSpec(rows=1, keys=keys, heads=16, head_dim=32, starts=(start,), ends=(end,)), 0)
    got = aiter(encode_ragged(case, aiter.contract), None)
    planted = mutants.ragged_mutant("ragged_tiles_from_key_0")(encode_ragged(case, CONTRACT), None)
    assert torch.equal(torch.isinf(got), torch.isinf(planted)) and torch.equal(torch.isnan(got), torch.isnan(planted))
    finite = torch.isfinite(got)
    torch.testing.assert_close(planted[finite], got[finite], rtol=1e-4, atol=1e-4)
