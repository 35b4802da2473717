"""The generic operation runner keeps going: a backend, an oracle or a comparison that raises is a verdict, and
under isolation one that aborts or hangs its worker is CRASH or TIMEOUT."""

from __future__ import annotations

import dataclasses

from difftest.backends.torch_topk import TorchTopk
from difftest.core.kinds import Isolation, OperationKind
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Drawn, Named, run_operation
from difftest.operations import operation
from tests.broken_topk import Aborts, Sleeps
from tests.planted_topk import PLANTED

TOPK = operation(OperationKind.TOPK)


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
