"""The generic operation runner keeps going: a backend, an oracle or a comparison that raises is a verdict, and
under isolation one that aborts or hangs its worker is CRASH or TIMEOUT."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from difftest.backends.torch_topk import TorchTopk
from difftest.core.kinds import Isolation, LogitsForm, MaskConvention, OperationKind
from difftest.core.ragged import RaggedContract
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Drawn, Named, run_operation
from difftest.engine.result import Judgement
from difftest.engine.runner import NotDrawn
from difftest.operations import operation
from tests.broken_topk import (
    Aborts,
    Exits,
    ForksInBoth,
    InterruptsItself,
    RunsOutOfMemory,
    SetsFloat64,
    Sleeps,
    SwallowsTheInterrupt,
)
from tests.difftest.operations.planted import OracleRagged
from tests.planted_topk import PLANTED

TOPK = operation(OperationKind.TOPK)
RAGGED = operation(OperationKind.RAGGED_LOGITS)


class Raises(TorchTopk):
    name = "raises"

    def __call__(self, inputs, out):
        raise RuntimeError("kernel exploded at launch")


def _case():
    return TOPK.build(TOPK.suite()[0], 0, "cpu")


def test_a_backend_that_raises_is_an_error_and_the_next_backend_still_runs():
    results = run_operation(TOPK, [Named("raises", Raises()), Named("torch-topk", TorchTopk())], [Drawn(_case())],
                            RunConfig())
    assert [r.verdict for r in results] == [Verdict.ERROR, Verdict.PASS]
    assert results[0].reason == "kernel exploded at launch" and "RuntimeError" in results[0].traceback


def test_an_oracle_that_raises_or_runs_out_of_memory_is_a_verdict_not_the_end_of_the_run():
    def broken(case, contract, oracle):
        raise RuntimeError("oracle bug")

    def exhausted(case, contract, oracle):
        raise MemoryError("no room")

    for reference, verdict in ((broken, Verdict.ERROR), (exhausted, Verdict.SKIP)):
        op = dataclasses.replace(TOPK, reference=reference)
        results = run_operation(op, [Named("torch-topk", TorchTopk())], [Drawn(_case()), Drawn(_case())], RunConfig())
        assert [r.verdict for r in results] == [verdict, verdict]
        assert results[0].reason.startswith("checking the output")


def test_a_call_that_runs_out_of_memory_earns_no_verdict_in_process_or_in_its_worker():
    """A GPU shared with other runs: the call's out-of-memory error is a SKIP that says so, not the kernel's
    ERROR or CRASH; the worker lives on for the next case."""
    cases = [Drawn(_case()), Drawn(_case())]
    for isolate in (False, True):
        results = run_operation(TOPK, [Named("oom", RunsOutOfMemory()), Named("torch-topk", TorchTopk())], cases,
                                RunConfig(isolate=isolate))
        assert [r.verdict for r in results] == [Verdict.SKIP, Verdict.PASS] * 2
        assert results[0].reason == ("the call ran out of memory (CUDA out of memory. Tried to allocate 818.00 MiB "
                                     "(planted)): no verdict")


def test_a_case_that_ran_out_of_memory_being_drawn_is_a_skip_for_each_backend_and_the_run_goes_on():
    lost = NotDrawn("big-s0", "big-s0", 0, "drawing it: CUDA out of memory", None)
    results = run_operation(TOPK, [Named("torch-topk", TorchTopk())], [Drawn(lost), Drawn(_case())], RunConfig())
    assert [(r.case, r.verdict) for r in results] == [("big-s0", Verdict.SKIP), (_case().name, Verdict.PASS)]
    assert results[0].reason == ("the case ran out of memory before any call (drawing it: CUDA out of memory): "
                                 "no verdict")


def test_under_isolation_a_backend_that_aborts_is_a_crash_and_the_next_backend_and_case_still_run():
    cases = [Drawn(TOPK.build(spec, 0, "cpu")) for spec in TOPK.suite()[:2]]
    results = run_operation(TOPK, [Named("aborts", Aborts()), Named("torch-topk", TorchTopk())], cases,
                            RunConfig(isolate=True))
    assert [r.verdict for r in results] == [Verdict.CRASH, Verdict.PASS] * 2
    assert {r.isolation for r in results} == {Isolation.WORKER}
    assert "killed by SIGABRT" in results[0].reason and "planted: the top-k kernel asserted" in results[0].reason


def test_under_isolation_a_backend_past_the_timeout_is_a_timeout_and_its_worker_is_killed():
    results = run_operation(TOPK, [Named("sleeps", Sleeps()), Named("torch-topk", TorchTopk())], [Drawn(_case())],
                            RunConfig(isolate=True, timeout=0.5))
    assert [r.verdict for r in results] == [Verdict.TIMEOUT, Verdict.PASS]
    assert results[0].reason == "no answer within 0.5 s; the worker was killed" and results[0].seconds < 5


def test_isolation_changes_no_result_of_a_backend_that_returns_or_raises():
    planted = [Named(backend.name, backend) for backend, _, _ in PLANTED[:2]]
    backends = [Named("torch-topk", TorchTopk()), Named("raises", Raises()), *planted]
    specs = {family for _, family, _ in PLANTED[:2]}
    cases = [Drawn(TOPK.build(p.spec, 0, "cpu")) for p in TOPK.envelope(PLANTED[0][0].contract, "cpu")
             if p.spec.name in specs]
    kept = ("backend", "case", "verdict", "reason", "error_type", "headline", "selection", "comparison")
    inside, outside = (run_operation(TOPK, backends, cases, RunConfig(isolate=isolate)) for isolate in (True, False))
    assert [[getattr(r, k) for k in kept] for r in inside] == [[getattr(r, k) for k in kept] for r in outside]
    assert {r.verdict for r in inside} >= {Verdict.PASS, Verdict.ERROR, PLANTED[0][2]}
    assert {r.isolation for r in inside} == {Isolation.WORKER} and {r.isolation for r in outside} == {None}


def test_a_backend_that_cannot_be_pickled_runs_in_process_and_says_why():
    class Local(TorchTopk):  # a class of a function's: pickle cannot name it
        name = "local"

    result, = run_operation(TOPK, [Named("local", Local())], [Drawn(_case())], RunConfig(isolate=True))
    assert result.verdict == Verdict.PASS and result.isolation == Isolation.IN_PROCESS
    assert "cannot travel to a worker process" in result.isolation_note


class FreshRelative(OracleRagged):
    """Right, window-relative; its contract a property that makes a new object at every access."""

    name = "fresh-relative"

    @property
    def contract(self):
        return RaggedContract(form=LogitsForm.WINDOW_RELATIVE, mask=MaskConvention.TAIL_NEG_INF, library="test")


class FreshAbsolute(FreshRelative):
    """Right, absolute (a row's key j at column j, keys columns wide); a fresh contract object per access."""

    name = "fresh-absolute"

    @property
    def contract(self):
        return RaggedContract(form=LogitsForm.ABSOLUTE, mask=MaskConvention.TAIL_NEG_INF, library="test")

    def __call__(self, inputs, out):
        relative = super().__call__(inputs, out)
        absolute = torch.full_like(relative, -math.inf)
        for row, (start, end) in enumerate(zip(inputs.k_start.tolist(), inputs.k_end.tolist(), strict=True)):
            absolute[row, start:end] = relative[row, :end - start]
        return absolute


def test_the_oracle_is_made_once_per_equal_contract_and_each_contract_is_judged_against_its_own():
    """Contracts made per access are new objects each time, and a freed one's id goes to the next (on the H200
    the ragged oracle at one contract's width was handed to another's output: ERROR on shape). Found by
    equality: equal contracts share one answer, a different contract gets its own."""
    made, judged = [], []

    def reference(case, contract, oracle):
        made.append(contract.form)
        return contract.width(case)

    def judge(width, got, case, contract):
        judged.append((contract.form, width == contract.width(case)))
        return Judgement(Verdict.PASS, "")

    op = dataclasses.replace(RAGGED, reference=reference, judge=judge)
    backends = [Named(f"{b.name}-{i}", b) for i, b in enumerate((FreshRelative(), FreshAbsolute(), FreshRelative()))]
    case = RAGGED.build(RAGGED.suite()[0], 0, "cpu")
    results = run_operation(op, backends, [Drawn(case)], RunConfig())
    assert [r.verdict for r in results] == [Verdict.PASS] * 3
    assert made == [LogitsForm.WINDOW_RELATIVE, LogitsForm.ABSOLUTE]
    assert judged == [(LogitsForm.WINDOW_RELATIVE, True), (LogitsForm.ABSOLUTE, True),
                      (LogitsForm.WINDOW_RELATIVE, True)]
    assert case.keys != case.seqlen_k, "the two widths differ on this case"


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "worker"])
def test_a_backend_that_exits_or_interrupts_itself_is_its_error_and_the_run_goes_on(isolate):
    """In-process, sys.exit(0) ended the run as a silent green with no report, and a KeyboardInterrupt the
    backend raised itself (no signal came) stopped it: each is that backend's ERROR, as for paged logits."""
    backends = [Named("exits", Exits()), Named("interrupts-itself", InterruptsItself()),
                Named("torch-topk", TorchTopk())]
    results = run_operation(TOPK, backends, [Drawn(_case()), Drawn(_case())], RunConfig(isolate=isolate))
    assert [r.verdict for r in results] == [Verdict.ERROR, Verdict.ERROR, Verdict.PASS] * 2, results
    assert results[0].error_type == "SystemExit" and results[0].reason == "SystemExit: 0", results[0]
    assert results[1].error_type == "KeyboardInterrupt" and "raised by the backend" in results[1].reason


def test_a_backend_that_changes_the_default_dtype_leaves_the_run_its_own():
    try:
        results = run_operation(TOPK, [Named("sets-float64", SetsFloat64()), Named("torch-topk", TorchTopk())],
                                [Drawn(_case()), Drawn(_case())], RunConfig())
        assert torch.get_default_dtype() == torch.float32, "the backend's default dtype outlived its call"
    finally:
        torch.set_default_dtype(torch.float32)
    assert [r.verdict for r in results] == [Verdict.PASS] * 4, results


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "worker"])
def test_a_backend_that_forks_and_returns_in_both_processes_adds_no_result(isolate, tmp_path):
    """The forked copy returned into difftest and went on with the run (in a worker: answered the parent too)."""
    made = tmp_path / "results"

    def record(result):
        with made.open("a") as file:
            file.write(f"{os.getpid()} {result.backend} {result.verdict.value}\n")

    cases = [Drawn(TOPK.build(spec, 0, "cpu")) for spec in TOPK.suite()[:2]]
    results = run_operation(TOPK, [Named("forks-in-both", ForksInBoth()), Named("torch-topk", TorchTopk())], cases,
                            RunConfig(isolate=isolate), on_result=record)
    assert [r.verdict for r in results] == [Verdict.PASS] * 4, results
    assert made.read_text().split("\n")[:-1] == [f"{os.getpid()} {r.backend} PASS" for r in results], \
        "every result made once, by this process"


def test_a_signal_the_backend_swallows_still_stops_the_run():
    """A SIGINT during the call whose KeyboardInterrupt the backend caught went unnoticed: the run went on."""
    with pytest.raises(KeyboardInterrupt):
        run_operation(TOPK, [Named("swallows", SwallowsTheInterrupt()), Named("torch-topk", TorchTopk())],
                      [Drawn(_case())], RunConfig())
