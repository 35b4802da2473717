"""AITER's Triton ragged logits kernel (amd-aiter 0.1.7.post2.dev18, the pinned wheel) under the Triton
interpreter: its contract, the window it gets wrong where k_start is no multiple of its 128-key tile
(docs/findings/aiter-triton-ragged-window.md) on the families that reach it, and its smallest case; the shift-keys
relation finding it with no oracle; AITER main's kernel passes the whole small plan, and keeps every relation on it,
where scripts/prepare_versions.sh has copied it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from difftest.backends import aiter_ragged
from difftest.backends.aiter_ragged import AiterRagged
from difftest.core.kinds import LogitsForm, MaskConvention, RaggedRelation
from difftest.core.ragged import RaggedCase, encode_ragged
from difftest.core.verdict import Verdict
from difftest.engine import ragged_metamorphic
from difftest.engine.ragged_comparison import RaggedComparison, compare_ragged
from difftest.generators.envelope import Target
from difftest.generators.ragged import RaggedPlanned, RaggedSpec, build_ragged_case, default_ragged_specs, ragged_plan
from difftest.oracles.ragged_reference import make_ragged_reference

PINNED = "0.1.7.post2.dev18"
MAIN = Path(__file__).resolve().parents[3] / ".device-deps/versions/aiter-main"


def judged(backend: AiterRagged, case: RaggedCase) -> RaggedComparison:
    got = backend(encode_ragged(case, backend.contract), None)
    return compare_ragged(make_ragged_reference(case, backend.contract.width(case)), got, case, backend.contract)


@pytest.fixture
def pinned() -> AiterRagged:
    backend = AiterRagged()
    if backend.unavailable_reason("cpu") or PINNED not in backend.contract.library:
        pytest.skip(f"needs amd-aiter {PINNED} importable by find_spec: {backend.unavailable_reason('cpu')} "
                    f"{backend.contract.library}")
    return backend


def test_the_contract_is_the_wrappers():
    contract = aiter_ragged.contract()
    assert (contract.form, contract.mask) == (LogitsForm.ABSOLUTE, MaskConvention.TAIL_NEG_INF)
    assert contract.powers_of_two and contract.tiles.kv == (128,) and contract.tiles.block_q(64) == 1
    assert AiterRagged().unavailable_reason("cuda") is not None or torch.cuda.is_available()


def test_windows_starting_off_the_tile_are_wrong_and_aligned_ones_right(pinned):
    """tile-128-ends: the same lengths from key 0 and from key 3; only the rows starting at 3 are wrong."""
    plan = ragged_plan(pinned.contract, Target.small_cpu())
    spec = next(p.spec for p in plan if isinstance(p, RaggedPlanned) and p.spec.name == "tile-128-ends")
    result = judged(pinned, build_ragged_case(spec, 0))
    from_three = [row for row, start in enumerate(spec.starts) if start == 3]
    assert result.verdict == Verdict.FAIL_MASK and result.comparison.mask_rows == from_three, result.headline()
    assert result.comparison.value_rows == [], "the values it does store belong to their keys"


def test_the_smallest_case_stores_its_one_key_past_the_row(pinned):
    """One row, keys 2, window [1, 2): what it stores for its one key goes to column 2, past the row (into the
    guard after the output; the key it read there is the one past the buffer), and the window's own column stays
    -inf. shrink_ragged reaches this case from the random suite's."""
    case = build_ragged_case(RaggedSpec(rows=1, keys=2, heads=16, head_dim=32, starts=(1,), ends=(2,)), 0)
    result = judged(pinned, case)
    assert result.comparison.mask_rows == [0] and "row 0 key 1 (window [1, 2))" in result.headline()
    assert pinned.last_out_of_bounds == 1


def test_shift_keys_finds_the_window_bug_with_no_oracle(pinned):
    """Windows off the 128-key tile ([3, 43), [130, 170)) moved 3 keys right come out wrong another way; the
    relations that leave every window where it is hold (the values it stores belong to their keys). Windows on the
    tile (random-full: every one from key 0), which the oracle passes, moved off it are wrong."""
    off = build_ragged_case(RaggedSpec(rows=2, keys=200, heads=16, head_dim=32, starts=(3, 130), ends=(43, 170)), 0)
    (violation,) = ragged_metamorphic.check(pinned, off, tuple(RaggedRelation))
    assert violation.relation == RaggedRelation.SHIFT_KEYS and violation.rows == (0, 1), violation.describe()
    on = build_ragged_case(next(s for s in default_ragged_specs() if s.name == "random-full"), 0)
    assert judged(pinned, on).verdict == Verdict.PASS
    assert ragged_metamorphic.check(pinned, on, (RaggedRelation.SHIFT_KEYS,))[0].rows


@pytest.mark.skipif(not (MAIN / "aiter" / aiter_ragged.KERNEL_FILES[1]).is_file(),
                    reason=f"no {MAIN / 'aiter' / aiter_ragged.KERNEL_FILES[1]}: scripts/prepare_versions.sh copies it "
                           "from a checkout of ROCm/aiter")
def test_main_passes_the_small_plan_and_keeps_every_relation(monkeypatch):
    monkeypatch.syspath_prepend(str(MAIN))
    backend = AiterRagged()
    assert str(MAIN) in backend.contract.library
    for planned in ragged_plan(backend.contract, Target.small_cpu()):
        if isinstance(planned, RaggedPlanned):
            case = build_ragged_case(planned.spec, 0)
            result = judged(backend, case)
            assert result.verdict == Verdict.PASS, f"{planned.spec.name}: {result.headline()}"
            violations = ragged_metamorphic.check(backend, case, tuple(RaggedRelation))
            assert violations == (), [v.describe() for v in violations]
