"""The runner end to end: mutants caught with predictable row counts, ERROR, SKIP, order, streaming."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from difftest.backends.torch_ref import TorchBackend
from difftest.backends.user import FunctionBackend, backend
from difftest.core import memory
from difftest.core.case import Case
from difftest.core.hardware import describe_gpu, gpu_description
from difftest.core.kinds import Isolation, LengthEncoding
from difftest.core.verdict import Verdict
from difftest.engine import batch_policy, call, runner
from difftest.engine.batch import merge
from difftest.engine.config import RunConfig
from difftest.engine.isolate import InProcess
from difftest.engine.result import CallMemory
from difftest.engine.runner import run, unsupported_reason
from difftest.generators import LengthDist, build_case
from difftest.oracles.paged_mqa_logits import reference
from difftest.oracles.reference import make_reference
from tests import memory_backends as mb
from tests import user_backends as ub
from tests.support import TINY, TINY_SPECS

# The vllm#59420 report: B = 16, next_n = 3, one long context per request.
VLLM_59420 = TINY.replace(name="vllm-59420", next_n=3, max_model_len=128, block_size=16,
                          lengths=tuple(40 + 5 * b for b in range(16)))


def _fn(f) -> FunctionBackend:
    return FunctionBackend.from_function(f)


def _limits(seq_len: int, next_n: int) -> list[int]:
    return [max(seq_len - next_n + j + 1, 0) for j in range(next_n)]


# --------------------------------------------------------------------------- mutants

def test_vllm_59420_per_sequence_reader_fed_the_per_row_table():
    case = build_case(VLLM_59420, 0)
    reader = _fn(ub.per_sequence_reader)
    lens, n = case.seq_lens.tolist(), case.next_n
    # What the reader sees: the first B entries of the flattened (B, next_n) table.
    flat = [limit for length in lens for limit in _limits(length, n)]
    predicted = [b * n + j for b in range(len(lens))
                 for j, (seen, true) in enumerate(zip(_limits(flat[b], n), _limits(lens[b], n), strict=True))
                 if seen != true]
    assert len(predicted) == 48, f"{predicted=}"

    (wrong,) = run([reader], [case], RunConfig(encoding=LengthEncoding.PER_ROW))
    assert wrong.verdict == Verdict.FAIL_MASK and wrong.overridden and wrong.encoding == "per-row", f"{wrong=}"
    assert wrong.comparison.mask_rows == predicted, f"{wrong.comparison.mask_rows=}"
    assert (len(wrong.comparison.mask_rows), wrong.comparison.rows) == (48, 48)

    (right,) = run([reader], [case], RunConfig())
    assert right.verdict == Verdict.PASS and not right.overridden and right.encoding == "per-sequence", f"{right=}"
    assert (len(right.comparison.mask_rows), right.comparison.rows) == (0, 48)


@pytest.mark.parametrize("spec", [s for s in TINY_SPECS if s.next_n > 1], ids=lambda s: s.name)
def test_sequence_length_for_every_row_is_caught_with_predicted_count(spec):
    mutant = _fn(ub.sequence_length_for_every_row)
    cases = [build_case(spec, seed) for seed in range(3)]
    results = run([mutant], cases, RunConfig())
    for case, result in zip(cases, results, strict=True):
        real = [b for b, length in enumerate(case.seq_lens.tolist()) if length > 0]
        predicted = [b * case.next_n + j for b in real for j in range(case.next_n - 1)]
        mask_rows = result.comparison.mask_rows
        assert mask_rows == predicted, f"{case.describe()}: {mask_rows=} {predicted=}"
        want = Verdict.FAIL_MASK if predicted else Verdict.PASS
        assert result.verdict == want, f"{case.describe()}: {result.verdict=}"


def test_window_one_short_is_caught_on_every_row_with_a_window():
    mutant = _fn(ub.window_one_short)
    case = build_case(TINY.replace(next_n=3, lengths=(0, 1, 2, 3, 4, 20)), 0)
    (result,) = run([mutant], [case], RunConfig())
    predicted = [r for r, limit in enumerate(case.row_lens().reshape(-1).tolist()) if limit > 0]
    assert result.verdict == Verdict.FAIL_MASK and result.comparison.mask_rows == predicted, f"{result.comparison=}"
    first = result.comparison.first_mismatch
    assert first.row == predicted[0] and first.position == case.row_lens().reshape(-1)[predicted[0]] - 1
    assert first.got == float("-inf") and first.kind == Verdict.FAIL_MASK, f"{first=}"


def test_correct_backends_pass_the_edge_specs():
    from difftest.generators import edge_cases

    backends = [TorchBackend(), _fn(ub.per_sequence_reader)]
    results = run(backends, [build_case(s, 0) for s in edge_cases()], RunConfig())
    assert len(results) == 2 * len(edge_cases())
    bad = [(r.case, r.backend, r.verdict.value, r.reason) for r in results if r.verdict != Verdict.PASS]
    assert not bad, f"{bad=}"


# --------------------------------------------------------------------------- ERROR, SKIP, unwritten

def test_raising_backend_is_error_and_others_still_run():
    cases = [build_case(TINY_SPECS[1], s) for s in range(2)]
    backends = [_fn(ub.raises), TorchBackend(), _fn(ub.wrong_shape), _fn(ub.per_sequence_reader)]
    results = run(backends, cases, RunConfig())
    verdicts = [(r.case, r.backend, r.verdict) for r in results]
    want = [(c.name, b.name, v) for c in cases for b, v in zip(
        backends, [Verdict.ERROR, Verdict.PASS, Verdict.ERROR, Verdict.PASS], strict=True)]
    assert verdicts == want, f"{verdicts=}"
    raised = results[0]
    assert raised.reason == "RuntimeError: kernel exploded at launch" and raised.comparison is None, f"{raised=}"
    shaped = results[2]
    want_shape = f"{[cases[0].rows, cases[0].max_model_len]}"
    assert "shape" in shaped.reason and want_shape in shaped.reason, f"{shaped.reason=}"


def test_unwritten_row_of_a_poisoned_buffer():
    case = build_case(TINY.replace(next_n=2, lengths=(7, 20)), 0)
    (result,) = run([ub.LeavesLastRowUnwritten()], [case], RunConfig())
    assert result.verdict == Verdict.FAIL_UNWRITTEN and result.comparison.unwritten_rows == [case.rows - 1], (
        f"{result.comparison=}")


@pytest.mark.parametrize("change, reason", [
    (dict(next_n=(1,)), "contract next_n [1] excludes 2"),
    (dict(head_dims=(128,)), "contract head_dim [128] excludes 16"),
    (dict(block_sizes=(64,)), "contract block_sizes [64] exclude 4 (and 1 is not listed)"),
    (dict(heads_multiple_of=16), "heads=2 is not a multiple of 16"),
    (dict(devices=("cuda",)), "declares devices ['cuda'], not cpu"),
])
def test_contract_exclusions_skip_with_reason(change, reason):
    excluded = dataclasses.replace(_fn(ub.per_sequence_reader), name="excluded")
    excluded.contract = dataclasses.replace(excluded.contract, **change)
    case = build_case(TINY.replace(next_n=2), 0)
    results = run([excluded, TorchBackend()], [case], RunConfig())
    assert [r.verdict for r in results] == [Verdict.SKIP, Verdict.PASS], f"{results=}"
    assert reason in results[0].reason, f"{results[0].reason=} {reason=}"
    assert results[0].comparison is None and results[0].seconds == 0.0


def test_contract_devices_skip_even_when_the_backend_says_available():
    case = build_case(TINY, 0)
    (result,) = run([ub.DeclaresCudaOnly()], [case], RunConfig())
    assert result.verdict == Verdict.SKIP and result.reason == "contract devices ['cuda'] exclude cpu", f"{result=}"


def test_block_size_one_contract_runs_on_a_repaged_case():
    token_reader = _fn(ub.per_sequence_reader)
    token_reader.contract = dataclasses.replace(token_reader.contract, block_sizes=(1,))
    case = build_case(TINY.replace(next_n=2, length_dist=LengthDist.EDGES), 0)
    assert unsupported_reason(token_reader, case, "cpu") is None
    (result,) = run([token_reader], [case], RunConfig())
    assert result.verdict == Verdict.PASS, f"{result=}"


def test_unencodable_case_is_skipped_with_reason():
    case = build_case(TINY, 0)  # block_size 4: no prefix-sum encoding
    (result,) = run([TorchBackend()], [case], RunConfig(encoding=LengthEncoding.PREFIX_SUM))
    assert result.verdict == Verdict.SKIP and result.reason.startswith("cannot encode: block_size=4"), f"{result=}"


# --------------------------------------------------------------------------- order and streaming

def test_results_in_case_backend_order_and_streamed():
    cases = [build_case(spec, 0) for spec in TINY_SPECS[:4]]
    backends = [TorchBackend(), _fn(ub.raises), _fn(ub.per_sequence_reader)]
    seen = []
    results = run(backends, iter(cases), RunConfig(), on_result=seen.append)
    order = [(r.case, r.backend) for r in results]
    assert order == [(c.name, b.name) for c in cases for b in backends], f"{order=}"
    assert len(seen) == len(results) == 12 and all(a is b for a, b in zip(seen, results, strict=True)), f"{len(seen)=}"


def test_on_result_sees_each_result_before_the_next_backend_runs():
    calls: list[str] = []

    @backend(contract=ub.PER_ROW, name="recorder")
    def recorder(q, kv_cache, weights, context_lens, block_table, max_model_len):
        calls.append("call")
        return ub.logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)

    run([_fn(recorder), _fn(recorder)], [build_case(TINY, 0)], RunConfig(),
        on_result=lambda r: calls.append(f"result:{r.verdict.value}"))
    assert calls == ["call", "result:PASS", "call", "result:PASS"], f"{calls=}"


def test_result_fields():
    case = build_case(TINY_SPECS[3], 2)
    (result,) = run([TorchBackend()], [case], RunConfig())
    assert (result.backend, result.case, result.rows, result.device) == ("torch", case.name, case.rows, "cpu")
    assert (result.encoding, result.layout, result.overridden) == ("per-row", "block-split", False)
    assert result.description == case.describe() and result.spec == case.meta["spec"], f"{result=}"
    assert result.seconds >= 0 and result.reason is None and result.gpu is None


# --------------------------------------------------------------------------- the GPU of a result

def test_gpu_description_is_none_on_the_cpu():
    assert gpu_description(torch.device("cpu")) is None


def test_describe_gpu_names_the_physical_device():
    h200 = SimpleNamespace(name="NVIDIA H200", pci_domain_id=0, pci_bus_id=0x19, pci_device_id=0, uuid="ignored")
    assert describe_gpu(0, h200, "3") == "cuda:0 NVIDIA H200 (PCI 0000:19:00.0, CUDA_VISIBLE_DEVICES=3)"
    older = SimpleNamespace(name="NVIDIA A100", uuid="5e0f6f3a-0000-1111-2222-333344445555")
    assert describe_gpu(1, older, None) == ("cuda:1 NVIDIA A100 (UUID 5e0f6f3a-0000-1111-2222-333344445555, "
                                            "CUDA_VISIBLE_DEVICES=unset)")


def test_make_reference_matches_oracle():
    case = build_case(TINY_SPECS[4], 1)
    ref = make_reference(case)
    assert torch.equal(ref.logits, reference(case))
    assert torch.equal(ref.row_lens, case.row_lens().reshape(-1))
    assert tuple(ref.bound.shape) == (case.rows,) and (ref.bound >= 0).all()


# --------------------------------------------------------------------------- isolated calls overlap

def _calls(log: Path) -> dict[str, tuple[float, float]]:
    rows = [line.split() for line in log.read_text().splitlines()]
    return {name: (float(start), float(end)) for name, start, end in rows}


@pytest.mark.parametrize("isolate", [True, False])
def test_isolated_workers_take_one_case_side_by_side(tmp_path, monkeypatch, isolate):
    """With isolation every backend's call on a case is sent before any answer is awaited, so the
    workers compute at once; in-process the calls follow each other, each result reported first."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv(ub.CALL_LOG, str(log))
    # Two cases: on the second both workers are long started, so only the runner decides the overlap.
    results = run([_fn(ub.recorded_a), _fn(ub.recorded_b)], [build_case(TINY, 0), build_case(TINY, 1)],
                  RunConfig(isolate=isolate))
    assert {(r.backend, r.verdict) for r in results} == {("recorded-a", Verdict.PASS), ("recorded-b", Verdict.PASS)}
    calls = _calls(log)  # the last call of each
    overlap = calls["recorded-a"][1] > calls["recorded-b"][0] and calls["recorded-b"][1] > calls["recorded-a"][0]
    assert overlap == isolate, f"{calls=}"


class _OutOfMemoryOnSubmit(InProcess):
    """The in-process executor, out of device memory when it copies a case's inputs for the call."""

    def submit(self, backend, inputs, launch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 36.50 GiB.")


def test_running_out_of_memory_handing_over_the_inputs_is_a_skip_with_the_numbers(monkeypatch):
    # On the H200 a fuzz batch's copy for a worker once asked for 36 GiB: that is the harness's memory,
    # not the backend's fault (no ERROR), and not a traceback that ends the run.
    monkeypatch.setattr(runner, "InProcess", _OutOfMemoryOnSubmit)
    case = build_case(TINY, 0)
    [result] = run([TorchBackend()], [case], RunConfig())
    assert result.verdict == Verdict.SKIP and result.error_type is None, f"{result=}"
    assert "with no other call beside it: preparing its inputs ran out (OutOfMemoryError" in result.reason
    assert "36.50 GiB" in result.reason and "it needs about" in result.reason and "free on cpu" in result.reason


def test_running_out_of_memory_encoding_the_inputs_is_a_skip_with_the_numbers(monkeypatch):
    # On the H200, four fuzz jobs side by side once left too little for one job's packed copy of a pool.
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    monkeypatch.setattr(call, "encode", out_of_memory)
    [result] = run([TorchBackend()], [build_case(TINY, 0)], RunConfig())
    assert result.verdict == Verdict.SKIP and "preparing its inputs" in result.reason, f"{result=}"
    assert "2.00 GiB" in result.reason and result.memory.alone, f"{result=}"


def _oracle_out_of_memory_above(rows: int):
    """make_reference, out of device memory on a case of more than `rows` rows (as on a shared GPU)."""
    def oracle(case, oracle_kind):
        if case.rows > rows:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 5.82 GiB.")
        return make_reference(case, oracle_kind)
    return oracle


def test_an_oracle_out_of_memory_skips_the_case_with_why_and_the_run_goes_on(monkeypatch):
    monkeypatch.setattr(runner, "make_reference", _oracle_out_of_memory_above(TINY.batch))
    big, small = build_case(TINY.replace(name="big", batch=4), 0), build_case(TINY, 1)
    streamed = []
    results = run([TorchBackend()], [big, small], RunConfig(), on_result=streamed.append)
    assert [(r.case, r.verdict) for r in results] == [(big.name, Verdict.SKIP), (small.name, Verdict.PASS)]
    assert "its oracle ran out of memory" in results[0].reason and "5.82 GiB" in results[0].reason
    assert "needs about" in results[0].reason and "free on cpu" in results[0].reason, results[0].reason
    assert streamed == results, "the skip is reported as it happens, like any result"


def test_checking_a_case_out_of_memory_skips_it_with_why_and_the_run_goes_on(monkeypatch):
    """The value checks of a production case allocate gigabytes on the device (an H200 fuzz campaign beside
    other runs met it): a SKIP with the numbers, never a run that dies."""
    checked = Case.validate

    def validate(case):
        if case.rows > TINY.batch * TINY.next_n:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB.")
        return checked(case)

    big, small = build_case(TINY.replace(name="big", batch=4), 0), build_case(TINY, 1)
    monkeypatch.setattr(Case, "validate", validate)
    results = run([TorchBackend()], [big, small], RunConfig())
    assert [(r.case, r.verdict) for r in results] == [(big.name, Verdict.SKIP), (small.name, Verdict.PASS)]
    assert "checking the case or its oracle ran out of memory" in results[0].reason, results[0].reason
    assert "4.00 GiB" in results[0].reason, results[0].reason


def test_a_batch_whose_merged_oracle_runs_out_of_memory_runs_its_members_alone(monkeypatch):
    merged_oracles = []

    def oracle(case, oracle_kind):
        merged_oracles.append(case.name)
        return _oracle_out_of_memory_above(TINY.batch)(case, oracle_kind)

    monkeypatch.setattr(batch_policy, "make_reference", oracle)
    members = [build_case(TINY, seed) for seed in range(3)]
    alone = run([TorchBackend()], members, RunConfig())
    streamed = []
    batched = run([TorchBackend()], [merge(members)], RunConfig(), on_result=streamed.append)
    assert [(r.case, r.verdict) for r in batched] == [(r.case, r.verdict) for r in alone]
    assert {r.verdict for r in batched} == {Verdict.PASS} and streamed == batched
    assert merged_oracles == [merge(members).case.name], "the merged case's oracle ran, and ran out"


# --------------------------------------------------------------------------- memory of calls side by side

FIXED = TINY.replace(name="fixed", lengths=(9, 0, 17))  # every seed draws a case of the same size


def test_isolated_a_call_out_of_memory_beside_others_passes_alone_and_later_cases_run_one_at_a_time(tmp_path,
                                                                                                  monkeypatch):
    """Three workers side by side: oom-beside-others runs out of memory only when another call overlaps it,
    oom-always every time. On the first case both are tried again alone once the others are done: the
    first passes there (its retry recorded), the second is a SKIP with the bytes it needs and those free.
    The rule learns: the next case as large runs its calls one at a time, nothing overlaps, nothing is
    retried. A warm-up case that only marks-its-call takes gives every worker time to start."""
    monkeypatch.setenv(mb.MARKERS, str(tmp_path))
    backends = [_fn(mb.oom_beside_others), _fn(mb.marks_its_call), _fn(mb.oom_always)]
    warm, first, second = (build_case(FIXED, seed) for seed in range(3))  # all of one size
    results = run(backends, [warm, first, second], RunConfig(isolate=True),
                  takes=lambda name, case: case.name != warm.name or name == "marks-its-call")
    by = {(r.case, r.backend): r for r in results}
    retried, peer, never = (by[(first.name, b.name)] for b in backends)
    assert (retried.verdict, peer.verdict, never.verdict) == (Verdict.PASS, Verdict.PASS, Verdict.SKIP), results
    assert retried.memory.retried.startswith("its call ran out of memory beside other calls (OutOfMemoryError: "
                                             "CUDA out of memory. Tried to allocate 8.00 GiB."), retried.memory
    assert retried.memory.alone and retried.isolation == Isolation.WORKER and peer.memory is None
    assert never.memory.retried and "with no other call beside it" in never.reason, never.reason
    assert "it needs about" in never.reason and "free on cpu now" in never.reason, never.reason
    later = [by[(second.name, b.name)] for b in backends]
    assert [r.verdict for r in later] == [Verdict.PASS, Verdict.PASS, Verdict.SKIP], later
    assert all(r.memory.alone and r.memory.retried is None for r in later), [r.memory for r in later]
    calls = (tmp_path / "calls.log").read_text().splitlines()
    # warm-up alone; the first case side by side, then oom-beside-others alone; the second case one at a time
    assert calls[0] == "marks-its-call alone" and set(calls[1:3]) == {"oom-beside-others overlapped",
                                                                       "marks-its-call overlapped"}, calls
    assert calls[3:] == ["oom-beside-others alone", "oom-beside-others alone", "marks-its-call alone"], calls


def test_in_process_a_call_out_of_memory_beside_others_passes_alone_and_the_rule_learns(tmp_path, monkeypatch):
    """In-process the calls of a case do not overlap, but side by side every backend's inputs are encoded
    and held before the first call: a call that runs out of memory there is tried again alone too."""
    monkeypatch.setenv(mb.MARKERS, str(tmp_path))
    first, second = build_case(FIXED, 0), build_case(FIXED, 1)
    results = run([_fn(mb.oom_on_first_call), TorchBackend()], [first, second], RunConfig())
    assert [r.verdict for r in results] == [Verdict.PASS] * 4, results
    assert results[0].memory.retried and results[0].memory.alone and results[1].memory is None, results[:2]
    assert all(r.memory.alone and not r.memory.retried for r in results[2:]), "the next case ran one call at a time"


def test_a_call_that_runs_out_of_memory_alone_is_a_skip_with_the_numbers_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv(mb.MARKERS, str(tmp_path))
    cases = [build_case(TINY, 0), build_case(TINY, 1)]
    results = run([_fn(mb.oom_always)], cases, RunConfig())
    assert [r.verdict for r in results] == [Verdict.SKIP, Verdict.SKIP] and results[0].error_type is None, results
    reason = results[0].reason
    assert reason.startswith("out of memory with no other call beside it: its call ran out (OutOfMemoryError: CUDA out "
                             "of memory. Tried to allocate 8.00 GiB."), reason
    shape = memory.Shape.of_case(cases[0])
    need = memory.call_bytes(shape, mb.CONTRACT)
    assert f"it needs about {memory.size_text(need.total)} ({need.describe()})" in reason, reason
    assert results[0].memory == CallMemory(counted=need.total, alone=True, ran_out=True), results[0].memory


def test_the_engines_own_comparison_out_of_memory_is_no_verdict_on_the_backend(monkeypatch):
    """Judging an output is the engine's allocation: out of memory there, alone, is a SKIP, never an
    ERROR (nor a traceback that ends the run)."""
    def out_of_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 2147483648 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(call, "compare", out_of_memory)
    [result] = run([TorchBackend()], [build_case(TINY, 0)], RunConfig())
    assert result.verdict == Verdict.SKIP and "judging its output ran out (RuntimeError" in result.reason, result


def test_the_side_by_side_scripts_copies_compute_the_oracle_interpreted_and_the_planted_one_fails():
    """scripts/device_visit.sh side-by-side runs tests/side_by_side_backends.py's copies on the GPU; on the CPU the
    same kernel runs interpreted: two copies PASS, the planted one loses each window's last key."""
    from tests.side_by_side_backends import Copy00, Copy10, Planted

    case = build_case(TINY.replace(name="side-by-side", heads=16, head_dim=32, block_size=16, max_model_len=64,
                                   lengths=(33, 0, 16), next_n=2), 0)
    results = run([Copy00(), Copy10(), Planted()], [case], RunConfig())
    assert [r.verdict for r in results] == [Verdict.PASS, Verdict.PASS, Verdict.FAIL_MASK], results
    assert results[2].comparison.mask_rows == [0, 1, 4, 5], "every row whose window holds a key"


class _Measured(InProcess):
    """The in-process executor, each call's outcome saying it allocated PER_LOGIT bytes a logit at its peak
    (what guards measures on a GPU)."""

    PER_LOGIT = 100

    def submit(self, backend, inputs, launch):
        pending = super().submit(backend, inputs, launch)
        return lambda: dataclasses.replace(pending(), peak_bytes=self.PER_LOGIT * launch.rows * launch.max_model_len)


def test_what_a_call_was_measured_to_allocate_is_noted_and_counted_for_the_backends_later_calls(monkeypatch):
    monkeypatch.setattr(runner, "InProcess", _Measured)
    cases = [build_case(FIXED, 0), build_case(FIXED, 1)]
    first, second = run([TorchBackend()], cases, RunConfig())
    shape = memory.Shape.of_case(cases[0])
    declared = memory.call_bytes(shape, TorchBackend().contract)
    assert first.memory.measured == second.memory.measured == _Measured.PER_LOGIT * shape.logits, first.memory
    assert first.memory.counted == declared.total, "its first call was counted at what it declares"
    assert second.memory.counted == declared.kernel + _Measured.PER_LOGIT * shape.logits, second.memory


def test_a_worker_killed_by_a_librarys_out_of_memory_abort_is_tried_alone_then_a_skip_not_a_crash(tmp_path):
    """A kernel library that aborts on a failed CUDA allocation takes its worker down: the text it left
    says why, so the call is tried again alone, and running out there too is a SKIP with the numbers."""
    backends = [_fn(mb.aborts_out_of_memory), TorchBackend()]
    results = run(backends, [build_case(FIXED, 0)], RunConfig(isolate=True))
    aborted = results[0]
    assert [r.verdict for r in results] == [Verdict.SKIP, Verdict.PASS], results
    assert "worker killed by SIGABRT" in aborted.reason and "CUDA error: out of memory" in aborted.reason, aborted
    assert aborted.memory.retried and aborted.memory.ran_out, aborted.memory
