"""The operation runner guards every call as the paged runner does (difftest.engine.guards.GuardedCall): repeated
launches compared (top-k: another right choice among ties is stable within tolerance, a launch that goes wrong is
FAIL(nondeterministic); ragged: values within the contract's tolerance), inputs a backend writes into named in
FAIL(mutated-input), and an output that is not the tensor the contract declares an ERROR that says what came
back, in-process and in a worker alike."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from difftest.backends.topk_mutants import TopkMutation, TorchTopkMutant
from difftest.backends.torch_topk import TorchTopk
from difftest.core.kinds import OperationKind
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Drawn, Named, run_operation
from difftest.engine.stability import StabilityKind
from difftest.generators.topk import TopkSpec, TopkValues, WindowDist
from difftest.operations import operation
from tests.difftest.operations.planted import OracleRagged, WrongAfterFirstTopk

TOPK = operation(OperationKind.TOPK)
RAGGED = operation(OperationKind.RAGGED_LOGITS)
# Values tied with the k-th on every row, straddling it: torch.topk's choice among them moves with the order.
TIES = TopkSpec(name="ties", rows=4, width=96, k=8, windows=WindowDist.FULL, values=TopkValues.TIED, ties=(6, 12))


def _topk_case():
    return TOPK.build(TIES, 0, "cpu")


def _ragged_case():
    return RAGGED.build(RAGGED.suite()[0], 0, "cpu")


class NoisyRagged(OracleRagged):
    """The right logits, every launch after the first off by `noise` relative to each value."""

    name = "noisy-ragged"
    noise = 1e-5

    def __init__(self):
        self.launches = 0

    def __call__(self, inputs, out):
        got = super().__call__(inputs, out)
        self.launches += 1
        return got * (1 + self.noise) if self.launches > 1 else got


class FarNoisyRagged(NoisyRagged):
    name = "far-noisy-ragged"
    noise = 0.05


def test_run_repeat_3_a_top_k_choosing_among_ties_is_stable_within_tolerance_and_passes():
    backends = [Named("random-ties", TorchTopkMutant(TopkMutation.RANDOM_TIES, "random-ties")),
                Named("torch-topk", TorchTopk())]
    shuffled, steady = run_operation(TOPK, backends, [Drawn(_topk_case())], RunConfig(repeat=3))
    assert shuffled.verdict == Verdict.PASS and shuffled.stability.kind == StabilityKind.WITHIN_TOLERANCE
    assert shuffled.stability.launches == 3 and shuffled.stability.moved_rows and not shuffled.stability.unstable_rows
    assert steady.verdict == Verdict.PASS and steady.stability.kind == StabilityKind.BITWISE


def test_run_repeat_3_a_top_k_that_goes_wrong_on_a_later_launch_is_fail_nondeterministic():
    result, = run_operation(TOPK, [Named("wrong-after-first", WrongAfterFirstTopk())], [Drawn(_topk_case())],
                            RunConfig(repeat=3))
    assert result.verdict == Verdict.FAIL_NONDETERMINISTIC
    assert result.stability.kind == StabilityKind.UNSTABLE and result.stability.unstable_rows == [0]


def test_one_launch_keeps_no_stability_record():
    backend = WrongAfterFirstTopk()
    result, = run_operation(TOPK, [Named(backend.name, backend)], [Drawn(_topk_case())], RunConfig())
    assert result.verdict == Verdict.PASS and result.stability is None


@pytest.mark.parametrize(("backend", "verdict", "kind"), [
    (NoisyRagged(), Verdict.PASS, StabilityKind.WITHIN_TOLERANCE),
    (FarNoisyRagged(), Verdict.FAIL_NONDETERMINISTIC, StabilityKind.UNSTABLE)])
def test_ragged_launches_within_the_contract_tolerance_are_stable_past_it_unstable(backend, verdict, kind):
    result, = run_operation(RAGGED, [Named(backend.name, backend)], [Drawn(_ragged_case())], RunConfig(repeat=2))
    assert (result.verdict, result.stability.kind) == (verdict, kind)


class WritesLogits(TorchTopk):
    """Right, but it leaves its logits negated (a kernel that sorts or masks in place)."""

    name = "writes-logits"

    def __call__(self, inputs, out):
        got = super().__call__(inputs, out)
        inputs.logits.neg_()
        return got


class WritesWindows(OracleRagged):
    """Right, but it shifts its k_start in place (an exclusive scan done into its input)."""

    name = "writes-windows"

    def __call__(self, inputs, out):
        got = super().__call__(inputs, out)
        inputs.k_start.add_(1)
        return got


@pytest.mark.parametrize("isolate", [False, True])
def test_a_top_k_that_writes_into_its_logits_is_fail_mutated_input_and_the_next_backend_sees_the_case_intact(
        isolate):
    backends = [Named("writes-logits", WritesLogits()), Named("torch-topk", TorchTopk())]
    case = _topk_case()
    before = case.storage.clone()
    wrote, after = run_operation(TOPK, backends, [Drawn(case)], RunConfig(isolate=isolate))
    assert wrote.verdict == Verdict.FAIL_MUTATED_INPUT and wrote.mutated_inputs == ("logits",)
    assert after.verdict == Verdict.PASS and after.mutated_inputs == ()
    assert torch.equal(case.storage, before)


def test_a_top_k_whose_contract_says_it_writes_into_its_logits_may():
    backend = WritesLogits()
    backend.contract = dataclasses.replace(TorchTopk.contract, mutates_logits=True)
    result, = run_operation(TOPK, [Named("declared", backend)], [Drawn(_topk_case())], RunConfig())
    assert result.verdict == Verdict.PASS and result.mutated_inputs == ()


def test_a_ragged_backend_that_writes_into_its_windows_is_fail_mutated_input():
    result, = run_operation(RAGGED, [Named("writes-windows", WritesWindows())], [Drawn(_ragged_case())], RunConfig())
    assert result.verdict == Verdict.FAIL_MUTATED_INPUT and result.mutated_inputs == ("k_start",)


class Returns(TorchTopk):
    """Returns what `make` makes of the right indices."""

    def __init__(self, name, make):
        self.name, self.make = name, make

    def __call__(self, inputs, out):
        return self.make(super().__call__(inputs, out))


class RaggedReturns(OracleRagged):
    def __init__(self, name, make):
        self.name, self.make = name, make

    def __call__(self, inputs, out):
        return self.make(super().__call__(inputs, out))


def _on_meta(got):
    return torch.empty(got.shape, dtype=got.dtype, device="meta")


@pytest.mark.parametrize(("backend", "got"), [
    (Returns("float-indices", lambda got: got.float()), "a torch.strided tensor of shape [4, 8], dtype torch.float32"),
    (Returns("none", lambda got: None), "NoneType"),
    (Returns("list", lambda got: got.tolist()), "list"),
    (Returns("meta", _on_meta), "a torch.strided tensor of shape [4, 8], dtype torch.int32, on meta"),
])
def test_a_top_k_output_that_is_not_integer_indices_on_the_case_device_is_an_error_saying_what_came_back(
        backend, got):
    result, = run_operation(TOPK, [Named(backend.name, backend)], [Drawn(_topk_case())], RunConfig())
    assert result.verdict == Verdict.ERROR and result.error_type == "contract"
    assert result.reason.startswith("contract: expected indices: a dense torch.Tensor of shape [4, 8], dtype "
                                    "torch.int32 or torch.int64, on cpu, got " + got)


@pytest.mark.parametrize("isolate", [False, True])
def test_ragged_float16_logits_under_a_float32_contract_are_an_error_in_process_and_in_a_worker(isolate):
    backend = RaggedReturns("half", lambda got: got.half())
    result, = run_operation(RAGGED, [Named("half", backend)], [Drawn(_ragged_case())], RunConfig(isolate=isolate))
    assert result.verdict == Verdict.ERROR and "dtype torch.float32 or torch.float64" in result.reason
    assert result.reason.endswith("dtype torch.float16, on cpu")


def test_a_contract_error_on_a_later_launch_is_an_error_too():
    launches = iter((lambda got: got, lambda got: None))
    backend = Returns("second-none", lambda got: next(launches)(got))
    result, = run_operation(TOPK, [Named("second-none", backend)], [Drawn(_topk_case())], RunConfig(repeat=2))
    assert result.verdict == Verdict.ERROR and result.reason.endswith("got NoneType")


def _indexer_case():
    indexer = operation(OperationKind.INDEXER)
    return indexer, indexer.build(indexer.suite()[0], 0, "cpu")


def test_a_composition_names_the_stage_that_wrote_into_its_inputs_and_its_repeats_are_compared():
    from difftest.backends import get_backends
    from difftest.operations.indexer import Composed

    indexer, case = _indexer_case()
    backends = [Named("writes", Composed("writes", get_backends(["torch"])[0], WritesLogits())),
                Named("right", Composed("right", get_backends(["torch"])[0], TorchTopk()))]
    wrote, right = run_operation(indexer, backends, [Drawn(case)], RunConfig(repeat=2))
    assert wrote.verdict == Verdict.FAIL_MUTATED_INPUT and wrote.mutated_inputs == ("logits (top-k stage)",)
    assert right.verdict == Verdict.PASS and right.stability.kind == StabilityKind.BITWISE


def test_a_composition_whose_top_k_stage_returns_float_indices_is_an_error():
    from difftest.backends import get_backends
    from difftest.operations.indexer import Composed

    indexer, case = _indexer_case()
    floats = Composed("floats", get_backends(["torch"])[0], Returns("float-indices", lambda got: got.float()))
    result, = run_operation(indexer, [Named("floats", floats)], [Drawn(case)], RunConfig())
    assert result.verdict == Verdict.ERROR and result.reason.startswith("contract: expected indices")


class IntoBuffer(OracleRagged):
    """Writes its logits into the poisoned buffer it is handed, all of it or (`rows_left`) all but its last rows."""

    contract = dataclasses.replace(OracleRagged.contract, writes_into_output=True)

    def __init__(self, name, rows_left=0):
        self.name, self.rows_left = name, rows_left

    def __call__(self, inputs, out):
        got = super().__call__(inputs, out)
        kept = got.shape[0] - self.rows_left
        out[:kept] = got[:kept]
        return out


def test_a_ragged_backend_that_writes_into_its_buffer_is_handed_poison_and_rows_it_leaves_are_unwritten():
    backends = [Named("whole", IntoBuffer("whole")), Named("short", IntoBuffer("short", rows_left=1))]
    whole, short = run_operation(RAGGED, backends, [Drawn(_ragged_case())], RunConfig())
    assert whole.verdict == Verdict.PASS
    assert short.verdict == Verdict.FAIL_UNWRITTEN and short.comparison.unwritten_rows == [short.rows - 1]


class FreshShort(OracleRagged):
    """Returns a fresh torch.empty_like tensor with every row but its last copied in."""

    name = "fresh-short"

    def __call__(self, inputs, out):
        got = super().__call__(inputs, out)
        fresh = torch.empty_like(got)
        fresh[:-1] = got[:-1]
        return fresh


def test_a_fresh_tensor_a_ragged_backend_leaves_unwritten_starts_as_poison():
    result, = run_operation(RAGGED, [Named("fresh-short", FreshShort())], [Drawn(_ragged_case())], RunConfig())
    assert result.verdict == Verdict.FAIL_UNWRITTEN and result.comparison.unwritten_rows == [result.rows - 1]
