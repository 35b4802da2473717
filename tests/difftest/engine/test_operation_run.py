"""The generic operation runner keeps going: a backend, an oracle or a comparison that raises is a verdict."""

from __future__ import annotations

import dataclasses

from difftest.backends.torch_topk import TorchTopk
from difftest.core.kinds import OperationKind
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Drawn, Named, run_operation
from difftest.operations import operation

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
