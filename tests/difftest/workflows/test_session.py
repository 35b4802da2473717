"""One `difftest run` as a library call: the envelope suite by default, reach, budget, reports."""

from __future__ import annotations

import json

import pytest
import torch

from difftest.core.errors import SpecError
from difftest.core.kinds import CaseKind, ExitStatus
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.plan import Shard, SuiteRequest
from difftest.generators.spec import CaseSpec, LengthDist
from difftest.records.report import render_reach
from difftest.workflows.session import RunRequest, execute
from tests.support import run_cli

FILTER = ("length-one-*", "block-boundaries-*", "all-padding-*")


def test_the_default_suite_is_the_envelope_one_with_reach_and_what_was_left_out(tmp_path):
    request = RunRequest(suite=SuiteRequest(case_filter=FILTER[:2]), backends=("torch",),
                         report=tmp_path / "r.json")
    outcome = execute(request)
    assert outcome.plan is not None and outcome.results and not outcome.status
    families = {f for r in outcome.results for f in r.reach.families}
    assert "tile-multiples" in families and "short-lengths" in families, families
    reach = render_reach(outcome.results, outcome.plan)
    assert reach.splitlines()[1].startswith("torch") and "tile-multiples" in reach, reach
    assert "torch: pool-2^31-bytes left out: " in reach, "a CPU run says which families need scale"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["run"]["cases_kind"] == "envelope" and report["run"]["plan"]["omitted"]["torch"], report["run"]


def test_a_kernel_wrong_only_past_16_table_columns_is_caught_on_the_cpu_through_its_declared_context():
    """It declares max_context 1024 at block 16: the small scale draws its max-context cases at 1024 tokens
    (64 columns), and exactly the cases with a sequence past 256 tokens fail; the reach table's longest
    and max-context come from those cases."""
    outcome = execute(RunRequest(suite=SuiteRequest(), backends=("tests.user_backends:wrong_past_16_columns",)))
    assert outcome.status == ExitStatus.FAILED, outcome.status
    failing = {r.case for r in outcome.results if r.verdict != Verdict.PASS}
    long = {r.case for r in outcome.results if r.reach.longest > 256}
    assert failing == long and "max-model-len-s4000" in failing, (failing, long)
    line = render_reach(outcome.results, outcome.plan).splitlines()[1].split()
    assert line[0] == "wrong-past-16-columns" and line[3] == "1024" and "max-context," in line, line


def test_the_reach_table_claims_for_each_backend_only_what_its_own_cases_reach():
    """torch (no envelope) and a backend declaring block 16 and max_context 1024 share cases; each one's
    families are those its own plan claims, and each claim holds for that backend's own contract."""
    from difftest.backends import load_backend
    from difftest.generators.envelope import EdgeFamily, Target, claim_reason
    from difftest.generators.spec import CaseSpec

    short = "tests.user_backends:wrong_past_16_columns"
    outcome = execute(RunRequest(suite=SuiteRequest(), backends=("torch", short)))
    contracts = {"torch": load_backend("torch").contract, "wrong-past-16-columns": load_backend(short).contract}
    for result in outcome.results:
        spec = CaseSpec.from_json(result.spec)
        for family in result.reach.families:
            why = claim_reason(EdgeFamily(family), spec, contracts[result.backend], Target.small_cpu())
            assert why is None, (result.backend, result.case, family, why)
    reached = {r.backend: {f for q in outcome.results if q.backend == r.backend for f in q.reach.families}
               for r in outcome.results}
    assert "partition-straddle" not in reached["torch"], "no partition declared, whoever else ran such a case"


def test_a_budget_starts_no_case_past_it_and_lists_those_not_started():
    request = RunRequest(suite=SuiteRequest(case_filter=FILTER), backends=("torch",), budget=1e-9)
    outcome = execute(request)
    assert not outcome.results and outcome.info["not_started"], outcome.info
    prefixes = ("length-one", "block-boundaries", "all-padding")
    assert all(name.startswith(prefixes) for name in outcome.info["not_started"]), outcome.info


def test_the_toy_suite_is_still_there():
    request = RunRequest(suite=SuiteRequest(cases=CaseKind.EDGES, case_filter=("length-one-*",)), backends=("torch",),
                         config=RunConfig())
    outcome = execute(request)
    assert outcome.plan is None and [r.case for r in outcome.results] == ["length-one-s1000"]


def test_a_spec_too_large_for_this_machine_is_refused_with_the_numbers_before_anything_is_allocated():
    huge = CaseSpec(batch=1024, max_model_len=262144, length_dist=LengthDist.FULL, heads=64, head_dim=128,
                    block_size=64)
    with pytest.raises(SpecError) as info:
        execute(RunRequest(suite=SuiteRequest(spec=huge), backends=("torch",)))
    assert info.value.field == "spec" and "GiB this cpu can spare; it needs" in info.value.expected, info.value


def test_a_backend_asked_for_by_name_that_skips_every_case_fails_the_run_with_the_reason():
    suite = SuiteRequest(cases=CaseKind.EDGES, case_filter=("length-one-*",))
    outcome = execute(RunRequest(suite=suite, backends=("torch", "tests.user_backends:DeclaresCudaOnly")))
    assert [r.verdict.value for r in outcome.results] == ["PASS", "SKIP"], outcome.results
    assert outcome.untested == {"cuda-only": "contract devices ['cuda'] exclude cpu"}, outcome.untested
    assert outcome.status == ExitStatus.FAILED
    # The envelope suite plans no case for it at all: the plan's reason is given.
    outcome = execute(RunRequest(suite=SuiteRequest(case_filter=FILTER[:1]),
                                 backends=("torch", "tests.user_backends:DeclaresCudaOnly")))
    assert list(outcome.untested) == ["cuda-only"] and outcome.status == ExitStatus.FAILED, outcome.untested



@pytest.mark.parametrize(("changed", "message"), [
    (["--encoding", "per-sequence"], "--encoding='per-sequence': expected None, what the run resumed from"),
    (["--layout", "token-interleaved"], "--layout='token-interleaved': expected None, what the run resumed from"),
    (["--repeat", "2"], "--repeat=2: expected 1, what the run resumed from"),
    (["--oracle", "fast"], "--oracle='fast': expected 'exact', what the run resumed from"),
    (["--cases", "all"], "--cases='all': expected 'edges', what the run resumed from"),
])
def test_resume_under_other_options_is_refused_in_one_line(tmp_path, changed, message):
    first = ["run", "--no-progress", "--cases", "edges", "--case-filter", "length-one-*", "--backends", "torch"]
    assert run_cli([*first, "--report", str(tmp_path / "r.json")])[0] == ExitStatus.OK
    for resumed in ("r.json", "r.jsonl"):
        argv = [*first, *changed, "--resume", str(tmp_path / resumed), "--report", str(tmp_path / "again.json")]
        code, _, err = run_cli(argv)
        assert code == ExitStatus.USAGE and err.count("\n") == 1, err
        assert err.startswith(f"difftest: error: {message} {tmp_path / resumed} used (its results"), err
    assert run_cli([*first, "--resume", str(tmp_path / "r.json"), "--report", str(tmp_path / "same.json")])[0] == 0


@pytest.mark.parametrize(("fields", "field"), [
    (dict(budget=0), "budget"), (dict(fail_slow=True), "fail_slow"), (dict(backends=("torch", "")), "backends"),
    (dict(gpus=2, resume="r.jsonl"), "resume"), (dict(gpus=2, suite=SuiteRequest(shard=Shard(0, 2))), "shard"),
])
def test_a_run_request_is_valid_by_construction(fields, field):
    """Checked once, where the request is made: execute() relies on it and checks none of it again."""
    with pytest.raises(SpecError) as info:
        RunRequest(**fields)
    assert info.value.field == field, info.value


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host where torch sees no GPU")
def test_a_cuda_run_on_a_host_without_one_is_refused_where_it_runs_naming_the_device():
    request = RunRequest(config=RunConfig(device="cuda"))  # valid: a request may be made for another host
    with pytest.raises(SpecError, match=r"device='cuda': expected a device torch can see"):
        execute(request)
