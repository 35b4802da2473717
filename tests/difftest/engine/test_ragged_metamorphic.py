"""Ragged logits metamorphic relations: each related case is drawn again from the case and the relation's name;
correct kernels (the ragged mutants' correct and head-rotating kernels, the oracle's own logits in either output
form, under either mask promise) keep every relation on their small plan; each relation is caught failing by a
planted bug that the oracle comparison also catches, and through the operation runner (RunConfig.metamorphic) by
one the oracle passes, FAIL(metamorphic); a related case the backend raises on is a violation; relations of
another operation are refused."""

from __future__ import annotations

import pytest
import torch

from difftest.backends import mutants
from difftest.core.errors import SpecError
from difftest.core.kinds import LogitsForm, MaskConvention, MetamorphicRelation, OperationKind, RaggedRelation
from difftest.core.ragged import RaggedContract, RaggedInputs, encode_ragged
from difftest.core.schema import to_jsonable
from difftest.core.verdict import Verdict
from difftest.engine import ragged_metamorphic
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Named, run_one
from difftest.engine.ragged_comparison import compare_ragged
from difftest.engine.result import CaseResult
from difftest.generators.envelope import Target
from difftest.generators.ragged import RaggedPlanned, RaggedSpec, build_ragged_case, ragged_plan
from difftest.operations import operation
from difftest.oracles.ragged_reference import make_ragged_reference
from tests.difftest.operations.planted import OracleRagged
from tests.planted_ragged import _ANY, ABSOLUTE_CLEAN, RELATIVE_CLEAN, RELATIVE_UNCLEANED, Planted

R = RaggedRelation
RAGGED = operation(OperationKind.RAGGED_LOGITS)
ABSOLUTE_UNCLEANED = RaggedContract(LogitsForm.ABSOLUTE, MaskConvention.TAIL_UNSPECIFIED, **_ANY)


def _plan(contract: RaggedContract) -> dict[str, RaggedSpec]:
    return {p.spec.name: p.spec for p in ragged_plan(contract, Target.small_cpu()) if isinstance(p, RaggedPlanned)}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (the NaN canaries of shift-keys too)."""
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def test_a_related_case_is_drawn_again_from_the_case_and_the_relations_name():
    case = build_ragged_case(_plan(ABSOLUTE_CLEAN)["chunked-prefill"], 0)
    for relation in R:
        first, again = ragged_metamorphic.related(case, relation), ragged_metamorphic.related(case, R(relation.value))
        suffixes = ["-1of2", "-2of2"] if relation == R.SPLIT_ROWS else [""]
        assert [c.name for c in first.cases] == [f"{case.name}~{relation.value}{s}" for s in suffixes]
        for one, other in zip(first.cases, again.cases, strict=True):
            assert all(_same_bits(getattr(one, f), getattr(other, f)) for f in ("q", "k", "k_scale", "weights",
                                                                                "k_start", "k_end")), relation
            assert "spec" not in one.meta and one.validate() is one
    single = build_ragged_case(RaggedSpec(rows=1, keys=20, heads=1, starts=(2,), ends=(9,)), 0)
    assert [r for r in R if ragged_metamorphic.related(single, r) is None] == [R.PERMUTE_ROWS, R.PERMUTE_HEADS,
                                                                              R.SPLIT_ROWS]


CORRECT = [mutants.ragged_mutant("ragged_correct"), mutants.ragged_mutant("ragged_rotated_head_sum"),
           Planted("right-absolute", "right", ABSOLUTE_CLEAN), Planted("right-relative", "right", RELATIVE_CLEAN),
           Planted("right-relative-zero-tail", "uncleaned", RELATIVE_UNCLEANED),
           Planted("right-absolute-zero-tail", "uncleaned", ABSOLUTE_UNCLEANED), OracleRagged()]


@pytest.mark.parametrize("backend", CORRECT, ids=lambda b: b.name)
def test_a_correct_kernel_keeps_every_relation_on_its_small_plan(backend):
    """The zero-tail ones write 0.0 past each window where their contract promises nothing: only windows relate."""
    for name, spec in _plan(backend.contract).items():
        case = build_ragged_case(spec, 1)
        assert ragged_metamorphic.check(backend, case, tuple(R)) == (), name


# Each relation against a planted bug the oracle also catches, on the plan's case that shows both.
PLANTED = [
    # tiles anchored to key 0: the windows from key 3 are wrong on the case, those from key 0 once moved to key 3
    (R.SHIFT_KEYS, lambda: mutants.ragged_mutant("ragged_tiles_from_key_0"), "tile-128-ends", Verdict.FAIL_MASK),
    # every row of a q block scored over its first row's window: shuffled, the blocks hold other first rows
    (R.PERMUTE_ROWS, lambda: mutants.ragged_mutant("ragged_block_first_window"), "disjoint-blocks", Verdict.FAIL_MASK),
    # logits clamped at 32: random-full's rows reach 41 (the oracle), doubled every logit past 16 (the relation)
    (R.SCALE_Q, lambda: Planted("planted-saturated", "saturated"), "random-full", Verdict.FAIL_VALUE),
    # heads 32..63 weighted with heads 0..31's weights: shuffled, other weights go to other heads
    (R.PERMUTE_HEADS, lambda: mutants.ragged_mutant("ragged_head_group_weights"), "heads-64", Verdict.FAIL_VALUE),
    # a window reaching the buffer's end stores a whole tile (NaN read past the end) over the next row; 37 keys
    # more and no window reaches the end
    (R.APPEND_KEYS, lambda: mutants.ragged_mutant("ragged_buffer_end_unmasked"), "buffer-end", Verdict.FAIL_NAN),
    # the rows past the last whole q block of 4 never scored: row 4 of 5 on the case, rows 2 of either half
    (R.SPLIT_ROWS, lambda: mutants.ragged_mutant("ragged_partial_block_dropped"), "rows-5", Verdict.FAIL_MASK),
]


@pytest.mark.parametrize("relation, make, family, verdict", PLANTED, ids=[r.value for r, *_ in PLANTED])
def test_each_relation_is_caught_failing_by_a_planted_bug_the_oracle_also_catches(relation, make, family, verdict):
    kernel = make()
    case = build_ragged_case(_plan(kernel.contract)[family], 0)
    got = kernel(encode_ragged(case, kernel.contract), None)
    judged = compare_ragged(make_ragged_reference(case, kernel.contract.width(case)), got, case, kernel.contract)
    assert judged.verdict == verdict, judged.headline()
    (violation,) = ragged_metamorphic.check(kernel, case, (relation,))
    assert violation.relation == relation and violation.related[0].startswith(f"{case.name}~{relation.value}")
    assert violation.rows and violation.describe().startswith(relation.value), violation.describe()
    assert violation.form == kernel.contract.form


# Each relation through the operation runner, against a planted bug on a case the oracle passes it on.
PASSED_BY_THE_ORACLE = [
    # every window starts at key 0, on a tile; moved to key 3, the whole tiles overrun them
    (R.SHIFT_KEYS, lambda: mutants.ragged_mutant("ragged_tiles_from_key_0"), "random-full"),
    # the one row whose window reaches the buffer's end is the last: its stray tile falls past the output; shuffled,
    # on a row after it
    (R.PERMUTE_ROWS, lambda: mutants.ragged_mutant("ragged_buffer_end_unmasked"), "chunked-prefill"),
    # its rows stay under 32; doubled, they do not
    (R.SCALE_Q, lambda: Planted("planted-saturated", "saturated"), "random-windows"),
    # 12 rows, three whole q blocks; halves of 6 drop their last 2
    (R.SPLIT_ROWS, lambda: mutants.ragged_mutant("ragged_partial_block_dropped"), "random-staircase"),
]


@pytest.mark.parametrize("relation, make, family", PASSED_BY_THE_ORACLE,
                         ids=[r.value for r, *_ in PASSED_BY_THE_ORACLE])
def test_a_relation_the_run_checks_makes_a_result_the_oracle_passes_fail_metamorphic(relation, make, family):
    kernel = make()
    case, named = build_ragged_case(_plan(kernel.contract)[family], 0), Named(kernel.name, kernel)
    others = tuple(r for r in R if r != relation)
    assert run_one(RAGGED, named, case, RunConfig(metamorphic=others)).verdict == Verdict.PASS
    result = run_one(RAGGED, named, case, RunConfig(metamorphic=tuple(R)))
    assert result.verdict == Verdict.FAIL_METAMORPHIC and result.comparison.mask_rows == []
    (violation,) = result.metamorphic
    assert violation.relation == relation and violation.rows
    assert violation.describe().startswith(f"{relation.value}"), violation.describe()
    # The pair again, from the case and the relation's name alone: the same violation.
    assert to_jsonable(ragged_metamorphic.check(kernel, case, (R(relation.value),))) == to_jsonable((violation,))
    assert to_jsonable(CaseResult.from_json(to_jsonable(result), "result.")) == to_jsonable(result)  # NaN != NaN


class ShortBuffers(Planted):
    """Right, but raises on a key buffer past 200 keys (a kernel with a fixed-size scratch)."""

    def __call__(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        if inputs.keys > 200:
            raise ValueError(f"{inputs.keys} keys: the scratch holds 200")
        return super().__call__(inputs, out)


def test_a_related_case_the_backend_raises_on_is_a_violation_that_says_so():
    backend = ShortBuffers("short-buffers", "right")
    case = build_ragged_case(_plan(ABSOLUTE_CLEAN)["random-full"], 0)  # 200 keys
    result = run_one(RAGGED, Named(backend.name, backend), case, RunConfig(metamorphic=(R.APPEND_KEYS, R.SCALE_Q)))
    assert result.verdict == Verdict.FAIL_METAMORPHIC
    (violation,) = result.metamorphic
    assert violation.rows == () and violation.describe() == (
        f"append-keys on {case.name}~append-keys (37 keys appended after the buffer; ERROR on {case.name}~append-keys: "
        "237 keys: the scratch holds 200)")


def test_relations_of_another_operation_are_refused_naming_the_field():
    case = build_ragged_case(_plan(ABSOLUTE_CLEAN)["random-full"], 0)
    with pytest.raises(SpecError, match=r"^metamorphic=\('scale-q',\): expected relations of the ragged-logits "
                                        r"operation: \['shift-keys', 'permute-rows', "):
        run_one(RAGGED, Named("planted-right", Planted("planted-right", "right")), case,
                RunConfig(metamorphic=(MetamorphicRelation.SCALE_Q,)))
