"""Kernel timing (`--time K`) and the performance differential: timings present and positive, the
per-batch set-up kept out of the timed region, the same verdicts with and without timing, in-process
and in workers, a planted slow sibling flagged, the schema round trip, and the CLI's one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from difftest.backends import as_loaded, get_backends
from difftest.backends import deep_gemm as dg
from difftest.backends.base import launcher
from difftest.backends.torch_ref import TorchBackend
from difftest.backends.user import FunctionBackend
from difftest.core.contract import Siblings
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import ExitStatus, TimedRegion, TimingMethod
from difftest.engine.config import RunConfig
from difftest.engine.performance import races, render_performance, slow
from difftest.engine.runner import run
from difftest.engine.timing import WARMUP, time_launches
from difftest.generators import build_case
from difftest.records.report import render_table, summarize, write_json
from difftest.records.serialize import ResultStream, load_results
from tests import planted
from tests import user_backends as ub
from tests.support import TINY, bits, run_cli

NO_GPU = "needs a CUDA GPU: torch.cuda.is_available() is False"
TWINS = "tests.planted:quick_twin,tests.planted:sleepy_twin"
SPEC = ["--spec", '{"lengths": [0, 1, 9], "next_n": 2, "heads": 2, "head_dim": 16, "block_size": 4, '
        '"max_model_len": 12}', "--no-progress"]


def _cases(count: int = 1) -> list:
    return [build_case(TINY.replace(next_n=2, lengths=(0, 3, 9)), seed) for seed in range(count)]


def _twins() -> list:
    return [FunctionBackend.from_function(planted.quick_twin), FunctionBackend.from_function(planted.sleepy_twin)]


def _verdicts(results: list) -> list:
    return [(r.backend, r.case, r.verdict, r.comparison.mask_rows if r.comparison else None) for r in results]


def test_cpu_timing_is_a_positive_perf_counter_median_and_changes_no_verdict():
    backends = [TorchBackend(), FunctionBackend.from_function(ub.window_one_short)]
    timed = run(backends, _cases(), RunConfig(time=3))
    plain = run(backends, _cases(), RunConfig())
    assert _verdicts(timed) == _verdicts(plain), f"{_verdicts(timed)=} {_verdicts(plain)=}"
    assert all(r.timing is None for r in plain)
    regions = {}
    for r in timed:
        t = r.timing
        assert t is not None and t.error is None and t.method == TimingMethod.PERF_COUNTER, f"{r.backend=} {t=}"
        assert t.launches == 3 and not t.l2_flush and 0 < t.minimum <= t.median <= t.maximum, f"{t=}"
        regions[r.backend] = t.region
    # torch declares prepare(); a decorated function does not and is timed whole.
    assert regions == {"torch": TimedRegion.KERNEL, "window-one-short": TimedRegion.WHOLE_CALL}, f"{regions=}"


class FailsWhenTimed:
    """Right on its first call (the checked one), raising on every later one (the timed ones)."""

    name = "fails-when-timed"
    contract = ub.PER_ROW

    def __init__(self) -> None:
        self.calls = 0

    def unavailable_reason(self, device: str) -> str | None:
        return None

    def __call__(self, inputs, out):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("launch failed when timed")
        return ub.logits_with_limits(inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens,
                                     inputs.block_table, inputs.max_model_len)


def test_a_timed_launch_that_raises_keeps_the_verdict_and_says_why(tmp_path):
    (result,) = run([FailsWhenTimed()], _cases(), RunConfig(time=3))
    assert result.verdict.value == "PASS" and result.timing is not None, f"{result=}"
    assert result.timing.error == "RuntimeError: launch failed when timed", f"{result.timing=}"
    assert load_results(write_json(tmp_path / "r.json", [result], {}))[0].timing.error == result.timing.error
    assert summarize([result])[0].kernel_seconds is None


class ReusesItsBuffer(FailsWhenTimed):
    """Returns one buffer of its own every call: right logits on the first, NaN on every later one."""

    name = "reuses-its-buffer"

    def __call__(self, inputs, out):
        self.calls += 1
        if self.calls == 1:
            self.buffer = ub.logits_with_limits(inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens,
                                                inputs.block_table, inputs.max_model_len)
        else:
            self.buffer.fill_(float("nan"))
        return self.buffer


def test_timed_launches_cannot_overwrite_the_checked_output():
    (result,) = run([ReusesItsBuffer()], _cases(), RunConfig(time=2))
    assert result.verdict.value == "PASS" and result.timing.error is None, f"{result=}"


def test_prepare_builds_once_outside_the_timed_region():
    backend = ub.PreparesOnce()
    case = _cases()[0]
    timing = time_launches(backend, encode(case, backend.contract), None, 3)
    assert timing.region == TimedRegion.KERNEL and backend.set_ups == 1, f"{timing=} {backend.set_ups=}"
    assert timing.maximum < ub.PreparesOnce.SETUP, f"the set-up's sleep leaked into the timed launches: {timing=}"


@pytest.mark.parametrize("name", ["torch", "aiter-triton-fused", "aiter-triton-stage1-ragged"])
def test_a_prepared_call_computes_what_the_call_computes(name):
    (backend,) = get_backends([name])
    if backend.unavailable_reason("cpu"):
        pytest.skip(backend.unavailable_reason("cpu"))
    spec = TINY.replace(next_n=2, lengths=(0, 3, 9), heads=32, head_dim=32, block_size=1, max_model_len=64)
    case = build_case(spec, 0)
    inputs = encode(case, backend.contract)
    assert torch.equal(bits(launcher(backend, inputs, None)()), bits(backend(inputs, None))), name


def _deepgemm_unavailable() -> str | None:
    return dg.DeepGemm("deepgemm").unavailable_reason("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(_deepgemm_unavailable() is not None, reason=f"needs DeepGEMM on a GPU: {_deepgemm_unavailable()}")
def test_deepgemm_builds_its_schedule_once_and_times_the_logits_kernel(monkeypatch):
    # The real library, its two entry points counted on their way through.
    module, _ = dg.load_deep_gemm()
    logits = next(n for n in ("fp8_fp4_paged_mqa_logits", "fp8_paged_mqa_logits") if hasattr(module, n))
    calls = {"get_paged_mqa_logits_metadata": 0, logits: 0}
    for name in list(calls):
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    backend = dg.DeepGemm("deepgemm")
    case = build_case(TINY.replace(next_n=2, lengths=(0, 3, 200), heads=64, head_dim=128, block_size=64,
                                   max_model_len=256), 0).to("cuda")
    timing = time_launches(backend, encode(case, backend.contract), None, 3)
    assert timing.error is None and timing.region == TimedRegion.KERNEL, f"{timing=}"
    assert list(calls.values()) == [1, WARMUP + 3], f"{calls=}"
    assert timing.siblings == Siblings(dg.SIBLINGS, 1.25), f"{timing.siblings=}"


def test_a_planted_slow_sibling_is_flagged_and_the_fast_one_is_not():
    results = run(_twins(), _cases(2), RunConfig(time=3))
    assert all(r.verdict.value == "PASS" for r in results), f"{_verdicts(results)=}"
    found = races(results)
    assert [(race.case, race.group) for race in found] == [(c.name, "planted-twins") for c in _cases(2)], f"{found=}"
    flagged = slow(found)
    assert {t.backend for _, t in flagged} == {"planted-sleepy-twin"} and len(flagged) == 2, f"{flagged=}"
    assert all(race.times[0].backend == "planted-quick-twin" and race.times[0].ratio == 1.0 for race in found)
    text = render_performance(found)
    assert "SLOW: planted-sleepy-twin on tiny-s0 [planted-twins]" in text and "allowed 2x" in text, text
    table = render_table(summarize(results))
    assert "kernel" in table.splitlines()[0] and "whole call timed" in table, table


def test_timing_works_in_isolated_workers():
    backends = [as_loaded(TorchBackend()), as_loaded(planted.quick_twin)]
    results = run(backends, _cases(), RunConfig(time=2, isolate=True, timeout=120))
    assert [r.isolation.value for r in results] == ["worker", "worker"], f"{results=}"
    for r in results:
        assert r.timing is not None and r.timing.median > 0 and r.timing.launches == 2, f"{r.backend=} {r.timing=}"
    assert results[1].timing.siblings == planted.TWINS.siblings and results[0].timing.siblings is None


def test_timings_round_trip_through_the_report_and_the_stream(tmp_path):
    results = run(_twins(), _cases(), RunConfig(time=2))
    report = write_json(tmp_path / "r.json", results, {"time": 2})
    stream = ResultStream(tmp_path / "r.jsonl")
    for r in results:
        stream.write(r)
    stream.close()
    assert load_results(report) == results and load_results(tmp_path / "r.jsonl") == results
    doc = json.loads(report.read_text())
    assert [t["backend"] for t in doc["performance"][0]["times"]] == ["planted-quick-twin", "planted-sleepy-twin"]
    sleepy = doc["summaries"][1]
    assert sleepy["kernel_seconds"] >= planted.SLEEP and sleepy["timed_region"] == "whole-call", f"{sleepy=}"


@pytest.mark.parametrize("field, value, expected", [
    ("method", "stopwatch", "one of ['cuda-events', 'perf-counter']"),
    ("launches", 0, "an integer in [1, 1000]"),
    ("siblings", {"group": "g", "slowdown": 0.5}, "a number in [1, inf)"),
])
def test_the_schema_names_a_bad_timing_field(tmp_path, field, value, expected):
    (result,) = run([FunctionBackend.from_function(planted.quick_twin)], _cases(), RunConfig(time=1))
    report = write_json(tmp_path / "r.json", [result], {})
    doc = json.loads(report.read_text())
    doc["results"][0]["timing"][field] = value
    report.write_text(json.dumps(doc))
    code, _, err = run_cli(["run", "--backends", "torch", "--resume", str(report), *SPEC])
    assert code == ExitStatus.USAGE and f"results[0].timing.{field}" in err and expected in err, f"{code=} {err=}"


def test_fail_slow_fails_the_run_and_the_report_has_the_performance_section(tmp_path):
    code, out, err = run_cli(["run", "--backends", TWINS, "--time", "3", "--fail-slow", *SPEC,
                              "--report", str(tmp_path / "r.json")])
    assert code == ExitStatus.FAILED, f"{code=}\n{out}\n{err}"
    assert "performance: siblings timed side by side on 1 case(s) in 1 group(s); 1 slower than allowed" in out, out
    assert "SLOW: planted-sleepy-twin on random-s0 [planted-twins]" in out, out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["run"]["time"] == 3 and doc["run"]["fail_slow"] is True, f"{doc['run']=}"
    assert [t["slow"] for t in doc["performance"][0]["times"]] == [False, True], f"{doc['performance']=}"


def test_a_slow_sibling_alone_does_not_fail_the_run():
    code, out, err = run_cli(["run", "--backends", TWINS, "--time", "2", *SPEC])
    assert code == ExitStatus.OK and "1 slower than allowed" in out, f"{code=}\n{out}\n{err}"


@pytest.mark.parametrize("argv, shown", [
    (["--time", "0"], "--time=0: expected an integer in [1, 1000]"),
    (["--time", "1001"], "--time=1001: expected an integer in [1, 1000]"),
    (["--time", "often"], "--time='often': expected an integer"),
    (["--fail-slow"], "--fail-slow=True: expected timed launches to compare"),
])
def test_bad_time_options_are_one_line_exit_2(argv, shown):
    code, _, err = run_cli(["run", "--backends", "torch", *argv, *SPEC])
    lines = err.strip().splitlines()
    assert code == ExitStatus.USAGE and len(lines) == 1 and shown in lines[0], f"{code=} {err=}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_cuda_timing_uses_event_pairs_with_an_l2_flush():
    backend = TorchBackend()
    case = _cases()[0].to("cuda")
    timing = time_launches(backend, encode(case, backend.contract), None, 5)
    assert timing.error is None and timing.method == TimingMethod.CUDA_EVENTS and timing.l2_flush, f"{timing=}"
    assert 0 < timing.minimum <= timing.median <= timing.maximum, f"{timing=}"
    again = run([backend], _cases(), RunConfig(device="cuda", time=3, isolate=False))
    assert again[0].timing.method == TimingMethod.CUDA_EVENTS and again[0].verdict.value == "PASS", f"{again=}"
