"""Graph replay (RunConfig.graph, difftest.engine.graph): the planted graph-replay bugs caught with it and
missed without it, right backends passing every replay, a backend that raises while capturing or replaying
an ERROR with the run going on, an encoding no captured buffer holds a SKIP, and a real CUDA graph of the
torch backend on a GPU."""

from __future__ import annotations

import pytest
import torch

from difftest.backends.registry import load_backend
from difftest.backends.torch_ref import TorchBackend
from difftest.backends.user import FunctionBackend
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import Isolation, LengthEncoding
from difftest.core.verdict import Verdict
from difftest.engine import graph
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import build_case
from difftest.generators.graph_family import FAMILY, ReplayStep, captured, replay_name
from tests import planted_graph as pg
from tests import user_backends as ub
from tests.support import TINY, TINY_SPECS

NO_GPU = "needs a CUDA GPU: torch.cuda.is_available() is False"
# A request longer than a split, one shorter, an empty one and one near max_model_len, next_n 2.
CAPTURED = TINY.replace(name="captured", next_n=2, block_size=16, max_model_len=128, lengths=(40, 7, 0, 100))
GROW = FAMILY.index(ReplayStep.GROW)


def _by_case(results):
    return {(r.backend, r.case): r for r in results}


@pytest.mark.parametrize("planted", [pg.ReusedSchedule, pg.SizeByValue])
def test_a_planted_graph_replay_bug_is_caught_with_graph_and_missed_without(planted):
    case = build_case(CAPTURED, 0)
    (plain,) = run([planted()], [case], RunConfig())
    assert plain.verdict == Verdict.PASS, f"{plain=}"

    results = run([planted()], [case], RunConfig(graph=True))
    assert [r.case for r in results] == [case.name, *(replay_name(case.name, i) for i in range(len(FAMILY)))]
    verdicts = {r.case: r.verdict for r in results}
    assert verdicts[case.name] == Verdict.PASS, verdicts
    grown = _by_case(results)[(planted.name, replay_name(case.name, GROW))]
    assert grown.verdict.failed and "graph replay (grow) of captured" in grown.description, f"{grown=}"
    # Lengths that only shrink or stay are scored in full by what was captured: those replays pass.
    assert all(v == Verdict.PASS for name, v in verdicts.items() if name != grown.case), verdicts


def test_the_reused_schedule_loses_keys_of_a_request_that_grew_while_the_longest_one_did_not():
    # (a) is per request: the longest request is captured at max_model_len already, the short one grows.
    case = build_case(CAPTURED.replace(lengths=(128, 7)), 0)
    results = _by_case(run([pg.ReusedSchedule(), pg.SizeByValue()], [case], RunConfig(graph=True)))
    grown = replay_name(case.name, GROW)
    assert results[(pg.ReusedSchedule.name, grown)].verdict.failed
    assert results[(pg.SizeByValue.name, grown)].verdict == Verdict.PASS, "the longest length did not change"


@pytest.mark.parametrize("spec", TINY_SPECS[:6], ids=lambda s: s.name)
def test_right_backends_pass_every_replay(spec):
    # A prepare split that keeps nothing, the torch backend's (its whole call), and none (a function backend).
    backends = [pg.Prepared(), TorchBackend(), FunctionBackend.from_function(ub.per_sequence_reader)]
    results = run(backends, [build_case(spec, 3)], RunConfig(graph=True))
    assert len(results) == 3 * (1 + len(FAMILY)) and all(r.verdict == Verdict.PASS for r in results), [
        (r.backend, r.case, r.verdict, r.reason) for r in results if r.verdict != Verdict.PASS]


def test_a_backend_without_prepare_is_its_whole_call_replayed():
    # window-one-short is wrong on every call: each replay reaches its call, so each replay with a visible key fails.
    case = build_case(CAPTURED, 0)
    results = run([FunctionBackend.from_function(ub.window_one_short)], [case], RunConfig(graph=True))
    assert [r.verdict.failed for r in results] == [True] * (1 + len(FAMILY)), [(r.case, r.verdict) for r in results]


class _RaisesOnReplay(pg.Prepared):
    """Right on any lengths without an empty request; raises on one with (the captured case has none)."""

    name = "raises-on-empty-replay"

    def prepare(self, inputs, out):
        right = super().prepare(inputs, out)

        def call():
            if (inputs.context_lens == 0).all(dim=1).any():
                raise RuntimeError("no work for an empty request")
            return right()

        return call


class _RaisesInPrepare(pg.Prepared):
    name = "raises-in-prepare"

    def __call__(self, inputs, out):
        return super().prepare(inputs, out)()

    def prepare(self, inputs, out):
        raise ValueError("cannot build the schedule")


def test_a_replay_that_raises_is_error_and_the_run_goes_on():
    case = build_case(CAPTURED.replace(lengths=(40, 7, 5, 100)), 0)
    results = _by_case(run([_RaisesOnReplay(), pg.Prepared()], [case], RunConfig(graph=True)))
    empty = replay_name(case.name, FAMILY.index(ReplayStep.ZERO_LENGTH))
    raised = results[("raises-on-empty-replay", empty)]
    assert raised.verdict == Verdict.ERROR and "no work for an empty request" in raised.reason, f"{raised=}"
    others = [r for (b, name), r in results.items() if b == "raises-on-empty-replay" and name != empty]
    assert [r.verdict for r in others] == [Verdict.PASS] * len(FAMILY), "the replays after it are judged"
    assert all(r.verdict == Verdict.PASS for (b, _), r in results.items() if b == pg.Prepared.name)


@pytest.mark.parametrize(("planted", "verdict", "said"), [("CrashesOnReplay", Verdict.CRASH, "SIGSEGV"),
                                                            ("HangsOnReplay", Verdict.TIMEOUT, "no answer within")])
def test_under_isolation_a_replay_that_kills_its_worker_or_hangs_is_a_verdict_and_the_run_goes_on(planted, verdict,
                                                                                                  said):
    case = build_case(CAPTURED, 0)
    broken, right = (load_backend(f"tests.planted_graph:{name}") for name in (planted, "Prepared"))
    results = run([broken, right], [case], RunConfig(graph=True, isolate=True, timeout=2.0))
    by_backend = {name: [r for r in results if r.backend == name] for name in (broken.name, right.name)}
    plain, *replays = by_backend[broken.name]
    assert plain.verdict == Verdict.PASS and [r.verdict for r in replays] == [verdict] * len(FAMILY), replays
    assert said in replays[0].reason and replays[0].isolation == Isolation.WORKER, f"{replays[0]=}"
    assert [r.verdict for r in by_backend[right.name]] == [Verdict.PASS] * (1 + len(FAMILY)), "the run went on"
    assert all(r.isolation == Isolation.WORKER for r in by_backend[right.name])


def test_a_capture_that_raises_makes_every_replay_an_error():
    case = build_case(CAPTURED, 0)
    plain, *replays = run([_RaisesInPrepare()], [case], RunConfig(graph=True))
    assert plain.verdict == Verdict.PASS and len(replays) == len(FAMILY)
    assert all(r.verdict == Verdict.ERROR and r.reason.startswith("capturing the call raised ValueError: cannot "
                                                                  "build the schedule") for r in replays), replays


def test_an_encoding_whose_shapes_follow_the_lengths_skips_its_replays():
    case = build_case(CAPTURED.replace(block_size=1), 0)
    plain, *replays = run([TorchBackend()], [case], RunConfig(graph=True, encoding=LengthEncoding.PREFIX_SUM))
    assert plain.verdict == Verdict.PASS
    assert all(r.verdict == Verdict.SKIP and "prefix-sum" in r.reason for r in replays), replays


class RebuiltEveryStep(pg.ReusedSchedule):
    """The reused schedule of (a), declared as a set-up its production caller rebuilds at every step (as vLLM
    rebuilds DeepGEMM's schedule): replaying the capture's would blame the kernel for the harness's staleness."""

    name = "planted-graph-rebuilt-every-step"
    rebuilt_every_step = "its caller's metadata builder"


def test_a_backend_whose_set_up_is_rebuilt_every_step_skips_its_replays_with_who_rebuilds_it():
    # On the H100 DeepGEMM's replays crashed on the capture's schedule (reports/h100/graph-replay): a false verdict.
    case = build_case(CAPTURED, 0)
    plain, *replays = run([RebuiltEveryStep()], [case], RunConfig(graph=True))
    assert plain.verdict == Verdict.PASS, f"{plain=}"
    assert replays and all(r.verdict == Verdict.SKIP and "its caller's metadata builder" in r.reason
                           for r in replays), replays


def test_a_backend_that_cannot_take_the_case_skips_its_replays_with_its_reason():
    case = build_case(CAPTURED, 0)
    results = run([ub.DeclaresCudaOnly()], [case], RunConfig(graph=True))
    assert [r.verdict for r in results] == [Verdict.SKIP] * (1 + len(FAMILY))
    assert len({r.reason for r in results}) == 1, "every replay says what the case's own SKIP says"


def test_replays_an_earlier_run_kept_are_not_made_again():
    case = build_case(CAPTURED, 0)
    first = run([pg.SizeByValue()], [case], RunConfig(graph=True))
    done = {(r.backend, r.case): r for r in first}
    heard = []
    again = run([pg.SizeByValue()], [case], RunConfig(graph=True), on_result=heard.append, done=done)
    assert again == first and heard == []


def test_graph_is_a_bool():
    with pytest.raises(Exception, match="graph"):
        RunConfig(graph="yes")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_a_cuda_graph_of_the_torch_backend_is_captured_and_replayed():
    case = build_case(CAPTURED, 0, device="cuda")
    results = run([TorchBackend()], [case], RunConfig(device="cuda", graph=True, isolate=False))
    assert [r.verdict for r in results] == [Verdict.PASS] * (1 + len(FAMILY)), [
        (r.case, r.verdict, r.reason) for r in results]
    # The path taken was a graph's: its static output is what each replay overwrites (the CPU has none).
    capture = graph.capture_call(TorchBackend(), encode(captured(case), TorchBackend.contract))
    assert isinstance(capture, graph.Captured) and capture.outputs, "a CUDA graph and the output it writes"
