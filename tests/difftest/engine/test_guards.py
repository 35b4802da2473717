"""The guards around a call, in-process: checksums, poisoned fresh tensors, repeats and their verdicts, and the
traceback an error keeps."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import difftest
from difftest.backends.torch_ref import TorchBackend
from difftest.backends.user import FunctionBackend, backend
from difftest.core.errors import SpecError
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import MaskConvention
from difftest.core.poison import is_poison
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.guards import (
    MAX_TRACEBACK_CHARS,
    Execution,
    Launch,
    PoisonFreshTensors,
    execute,
    fill_poison,
    fingerprint,
    formatted_traceback,
    input_fingerprints,
)
from difftest.engine.runner import run
from difftest.engine.stability import StabilityKind, classify_stability
from difftest.generators import build_case
from difftest.oracles.reference import make_reference
from tests import broken_backends as bb
from tests.support import TINY

CASE_SPEC = TINY.replace(next_n=2, lengths=(7, 20, 0))


def _fn(f) -> FunctionBackend:
    return FunctionBackend.from_function(f)


# --------------------------------------------------------------------------- fingerprints

@pytest.mark.parametrize("tensor", [
    torch.arange(24, dtype=torch.float32).reshape(4, 6),
    torch.arange(7, dtype=torch.uint8),  # a byte count that is no multiple of 4
    torch.arange(30, dtype=torch.int64).reshape(5, 6).t(),  # non-contiguous
], ids=["float32", "odd-bytes", "transposed"])
def test_fingerprint_sees_every_single_change_and_every_swap(tensor):
    base = fingerprint(tensor)
    assert fingerprint(tensor.clone()) == base
    flat = tensor.contiguous().reshape(-1)
    for index in range(flat.numel()):
        changed = flat.clone()
        changed[index] += 1
        assert fingerprint(changed.reshape(tensor.shape)) != base, f"{index=}"
    swapped = flat.clone()
    swapped[[0, -1]] = swapped[[-1, 0]]
    assert fingerprint(swapped.reshape(tensor.shape)) != base


def test_input_fingerprints_name_every_tensor_handed_over():
    case = build_case(CASE_SPEC, 0)
    inputs = encode(case, TorchBackend.contract)
    prints = input_fingerprints(inputs)
    assert set(prints) == {"q", "kv_cache", "weights", "context_lens", "block_table"}
    assert prints == {name: fingerprint(getattr(inputs, name)) for name in prints}  # read back at once, same sums


# --------------------------------------------------------------------------- poison

def test_fresh_tensors_start_as_poison_inside_the_mode_only():
    like = torch.ones(3, 4)
    with PoisonFreshTensors():
        made = [torch.empty(2, 5), torch.empty_like(like), like.new_empty(6), torch.empty(3, dtype=torch.bfloat16),
                torch.empty(2, 3).t()]
        zeros, ints = torch.zeros(4), torch.empty(4, dtype=torch.int32)
    outside = torch.empty(1000)
    assert all(bool(is_poison(t).all()) for t in made), [is_poison(t) for t in made]
    assert not is_poison(zeros).any() and ints.dtype == torch.int32
    assert not is_poison(outside).all()


def test_fill_poison_keeps_the_payload_bit_for_bit():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        tensor = torch.zeros(3, 4, dtype=dtype)
        fill_poison(tensor)
        assert bool(is_poison(tensor).all()), f"{dtype=}"


# --------------------------------------------------------------------------- execute

def test_execute_names_the_mutated_input():
    case = build_case(CASE_SPEC, 0)
    writer = _fn(bb.writes_into_inputs)
    outcome = execute(writer, encode(case, writer.contract), Launch(case.rows, case.max_model_len))
    assert isinstance(outcome, Execution) and outcome.mutated == ("weights",), f"{outcome=}"


def test_execute_turns_a_non_tensor_output_into_error():
    @backend(contract=bb.CONTRACT, name="returns-none")
    def returns_none(q, kv_cache, weights, context_lens, block_table, max_model_len):
        return None

    case = build_case(CASE_SPEC, 0)
    (result,) = run([_fn(returns_none)], [case], RunConfig())
    assert result.verdict == Verdict.ERROR, f"{result=}"
    assert result.reason == f"contract: expected a dense torch.Tensor of shape [rows, max_model_len] = " \
                            f"{[case.rows, case.max_model_len]}, dtype torch.float32 or torch.float64, on cpu, " \
                            "got NoneType", f"{result.reason=}"
    assert result.error_type == "contract", f"{result=}"


def test_mutated_inputs_verdict_and_the_case_is_left_intact_for_the_next_backend():
    case = build_case(CASE_SPEC, 0)
    weights = case.weights.clone()
    writer, torch_backend = _fn(bb.writes_into_inputs), TorchBackend()
    results = run([writer, torch_backend, writer], [case], RunConfig())
    assert [r.verdict for r in results] == [Verdict.FAIL_MUTATED_INPUT, Verdict.PASS, Verdict.FAIL_MUTATED_INPUT]
    assert results[0].mutated_inputs == ("weights",) and results[1].mutated_inputs == ()
    assert results[0].comparison.verdict == Verdict.PASS, "the output itself was right"
    assert torch.equal(case.weights, weights)


def test_own_output_left_unwritten_reads_back_as_poison():
    case = build_case(CASE_SPEC, 0)
    (result,) = run([_fn(bb.leaves_row_unwritten)], [case], RunConfig())
    assert result.verdict == Verdict.FAIL_UNWRITTEN, f"{result=}"
    assert result.comparison.unwritten_rows == [case.rows - 1], f"{result.comparison=}"


def test_read_past_the_used_width_hits_the_nan_canary():
    case = build_case(CASE_SPEC, 0)  # stale entries point at NaN canary blocks
    (result,) = run([_fn(bb.reads_past_table)], [case], RunConfig())
    # Rows whose window reaches the last used block of a sequence that has a column after it.
    width, size = case.block_table.shape[1], case.block_size
    used = case.used_blocks().tolist()
    limits = case.row_lens().tolist()
    predicted = [b * case.next_n + j for b, row in enumerate(limits) for j, limit in enumerate(row)
                 if 0 < used[b] < width and limit > (used[b] - 1) * size]
    assert predicted == [0, 1], f"{predicted=}"  # L = 7 reaches its second block; L = 20 fills the table
    assert result.verdict == Verdict.FAIL_NAN and result.comparison.nan_rows == predicted, f"{result=}"


# --------------------------------------------------------------------------- repeats

def test_repeat_classifies_bitwise_tolerance_and_unstable():
    cases = [build_case(CASE_SPEC.replace(heads=16), seed) for seed in range(2)]  # 16 terms: order matters
    backends = [TorchBackend(), _fn(bb.reorders_heads), _fn(bb.nondeterministic)]
    results = run(backends, cases, RunConfig(repeat=3))
    got = [(r.backend, r.verdict, r.stability.kind, r.stability.launches) for r in results]
    want = [(name, verdict, kind, 3) for _ in cases for name, verdict, kind in [
        ("torch", Verdict.PASS, StabilityKind.BITWISE),
        ("reorders-heads", Verdict.PASS, StabilityKind.WITHIN_TOLERANCE),
        ("broken-nondeterministic", Verdict.FAIL_NONDETERMINISTIC, StabilityKind.UNSTABLE)]]
    assert got == want, f"{got=}"
    unstable = results[2].stability
    assert unstable.unstable_rows and set(unstable.unstable_rows) <= set(unstable.moved_rows), f"{unstable=}"
    assert unstable.max_abs_diff > 0 and results[0].stability.moved_rows == []


def test_a_reused_output_buffer_keeps_each_launch_apart():
    launches: list[torch.Tensor] = []

    @backend(contract=bb.CONTRACT, name="reuses-its-buffer")
    def reuses(q, kv_cache, weights, context_lens, block_table, max_model_len):
        out = launches[0] if launches else torch.empty(weights.shape[0], max_model_len, dtype=torch.float64)
        out.copy_(bb.logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len))
        out[0, 0] += len(launches)  # the second launch moves one value; it returns the same buffer
        launches.append(out)
        return out

    (result,) = run([_fn(reuses)], [build_case(CASE_SPEC, 0)], RunConfig(repeat=2))
    assert result.stability.kind == StabilityKind.UNSTABLE and result.stability.unstable_rows == [0], f"{result=}"
    assert result.comparison.verdict == Verdict.PASS, "the first launch's bits were kept, not the second's"


def test_one_launch_records_no_stability():
    (result,) = run([TorchBackend()], [build_case(CASE_SPEC, 0)], RunConfig())
    assert result.stability is None


def _launches(case, *changes):
    """The oracle's logits as float32 launches, each with `changes` applied: (row, position, value)."""
    ref = make_reference(case)
    base = ref.logits.float()
    outputs = [base]
    for row, position, value in changes:
        moved = base.clone()
        moved[row, position] = value
        outputs.append(moved)
    return ref, tuple(outputs)


def test_classify_stability_rows_and_tolerance():
    case = build_case(CASE_SPEC, 0)
    ref, _ = _launches(case)
    value = float(ref.logits[1, 3])
    nudged = torch.nextafter(torch.tensor(value, dtype=torch.float32), torch.tensor(1e9)).item()
    _, outputs = _launches(case, (1, 3, nudged), (2, 0, value + 10.0))
    contract = TorchBackend.contract
    within = classify_stability(outputs[:2], ref.logits, ref.row_lens, dataclasses.replace(contract, rtol=1e-3))
    assert (within.kind, within.moved_rows, within.unstable_rows) == (StabilityKind.WITHIN_TOLERANCE, [1], [])
    unstable = classify_stability(outputs, ref.logits, ref.row_lens, dataclasses.replace(contract, rtol=1e-3))
    assert (unstable.kind, unstable.moved_rows, unstable.unstable_rows) == (StabilityKind.UNSTABLE, [1, 2], [2])


def test_classify_stability_allows_the_oracles_bound_as_compare_does():
    case = build_case(CASE_SPEC, 0)
    ref, _ = _launches(case)
    value, bound = float(ref.logits[0, 0]), float(ref.bound[0])
    tight = dataclasses.replace(TorchBackend.contract, rtol=1e-15)
    kinds = [classify_stability(_launches(case, (0, 0, value + moved))[1], ref.logits, ref.row_lens, tight,
                                ref.bound).kind for moved in (bound / 2, 4 * bound)]
    assert kinds == [StabilityKind.WITHIN_TOLERANCE, StabilityKind.UNSTABLE], f"{kinds=} {bound=}"


def test_classify_stability_ignores_the_tail_only_where_it_is_unspecified():
    case = build_case(CASE_SPEC, 0)
    limit = int(case.row_lens().reshape(-1)[0])
    ref, outputs = _launches(case, (0, limit, 123.0))  # past row 0's window
    strict = classify_stability(outputs, ref.logits, ref.row_lens, TorchBackend.contract)
    loose = classify_stability(outputs, ref.logits, ref.row_lens,
                               dataclasses.replace(TorchBackend.contract, mask=MaskConvention.TAIL_UNSPECIFIED))
    assert (strict.kind, strict.unstable_rows) == (StabilityKind.UNSTABLE, [0]), f"{strict=}"
    assert loose.kind == StabilityKind.BITWISE, f"{loose=}"


def test_classify_stability_counts_a_changed_nan_payload():
    case = build_case(CASE_SPEC, 0)
    ref, outputs = _launches(case)
    first, second = outputs[0].clone(), outputs[0].clone()
    first[0, 0], second[0, 0] = float("nan"), float("nan")
    second.view(torch.int32)[0, 0] = 0x7FC0DEAD  # the poison: unwritten on the second launch only
    found = classify_stability((first, second), ref.logits, ref.row_lens, TorchBackend.contract)
    assert (found.kind, found.moved_rows) == (StabilityKind.UNSTABLE, [0]), f"{found=}"


# --------------------------------------------------------------------------- the config

@pytest.mark.parametrize("change, field", [
    (dict(repeat=0), "repeat"), (dict(repeat=2.0), "repeat"), (dict(timeout=0), "timeout"),
    (dict(timeout=float("nan")), "timeout"), (dict(timeout=float("inf")), "timeout"),
    (dict(timeout=5, isolate=False), "timeout"), (dict(sanitize="valgrind"), "sanitize"),
    (dict(sanitize_all=True), "sanitize_all"), (dict(device="tpu"), "device"), (dict(encoding="per-row"), "encoding"),
    (dict(layout="block-split"), "layout"), (dict(isolate="yes"), "isolate"),
])
def test_run_config_rejects_what_it_cannot_mean(change, field):
    with pytest.raises(SpecError) as info:
        RunConfig(**change)
    assert info.value.field == field, f"{info.value}"


def test_isolation_default_follows_the_device_and_the_timeout():
    assert not RunConfig().isolated and RunConfig(timeout=3).isolated and RunConfig(isolate=True).isolated
    assert RunConfig.__dataclass_fields__["isolate"].default is None


# --------------------------------------------------------------------------- the evidence of an error

def test_a_raising_backend_keeps_its_traceback_from_the_backend_down():
    case = build_case(CASE_SPEC, 0)
    nested = _fn(bb.raises_nested)
    fault = execute(nested, encode(case, nested.contract), Launch(case.rows, case.max_model_len))
    assert fault.verdict == Verdict.ERROR and fault.reason.startswith("RuntimeError: nested launch failed")
    assert fault.traceback.startswith("Traceback (most recent call last):\n"), fault.traceback
    assert all(line in fault.traceback for line in bb.nested_traceback_lines()), fault.traceback
    assert str(Path(difftest.__file__).parent) not in fault.traceback, "difftest's frames above the backend: left out"
    result = run([nested], [case], RunConfig())[0]
    assert result.verdict == Verdict.ERROR and result.traceback == fault.traceback


def test_a_base_exception_and_a_failing_availability_check_keep_theirs_too():
    case = build_case(CASE_SPEC, 0)
    exits, unavailable = run([_fn(bb.exits), bb.unavailable_raises()], [case], RunConfig())
    assert exits.verdict == Verdict.ERROR and "in exits\n" in exits.traceback and "SystemExit: 3" in exits.traceback
    assert unavailable.verdict == Verdict.ERROR and "in unavailable_reason\n" in unavailable.traceback
    assert "RuntimeError: driver query failed" in unavailable.traceback


def test_a_contract_violation_has_no_traceback_of_its_own():
    case = build_case(CASE_SPEC, 0)
    wide = _fn(bb.wide_output)
    fault = execute(wide, encode(case, wide.contract), Launch(case.rows, case.max_model_len))
    assert fault.verdict == Verdict.ERROR and fault.reason.startswith("contract: ") and fault.traceback is None


def test_a_deep_traceback_keeps_its_innermost_frames_and_message_within_the_bound():
    def ping(n: int) -> None:  # two functions in turn: Python folds a run of one repeated frame
        if n == 0:
            raise ValueError("the innermost")
        pong(n - 1)

    def pong(n: int) -> None:
        ping(n)

    with pytest.raises(ValueError) as caught:
        ping(400)
    text = formatted_traceback(caught.value)
    assert len(text) <= MAX_TRACEBACK_CHARS and text.startswith("[... ") and "earlier characters cut]\n" in text
    assert text.endswith('in ping\n    raise ValueError("the innermost")\nValueError: the innermost\n'), text[-300:]
    assert text.splitlines()[1].startswith("  File "), "cut on a line boundary"
