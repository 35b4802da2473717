"""`difftest fuzz` aimed at a regime: bounds on the drawn cases, refused in one line when impossible,
and small cases batched with a batch-only failure reported apart from the failures that count."""

from __future__ import annotations

import importlib
import json

import pytest

from difftest.cli import main
from difftest.core.errors import SpecError
from difftest.core.kinds import ExitStatus
from difftest.core.spec import CaseSpec
from difftest.engine.config import RunConfig
from difftest.generators.regime import Regime
from difftest.records.serialize import ResultStream
from difftest.workflows.fuzz import Campaign, describe_retries, fuzz, render_campaign

PLANTED_BATCH = "tests.planted:wrong_past_batch_limit"


def test_a_drawn_spec_is_clamped_and_a_fixed_one_kept_only_if_it_fits():
    regime = Regime(max_batch=3, max_context=64)
    drawn = regime.apply(CaseSpec(batch=8, padding=4, max_model_len=256))
    assert (drawn.batch, drawn.padding, drawn.max_model_len) == (1, 2, 64)
    assert regime.apply(CaseSpec(lengths=(5, 60), max_model_len=256)).max_model_len == 64
    assert regime.apply(CaseSpec(lengths=(5, 65), max_model_len=256)) is None
    assert regime.apply(CaseSpec(lengths=(1, 2, 3, 4), max_model_len=8)) is None
    assert regime.apply(CaseSpec(pool_blocks=1 << 16, high_block_ids=True)) is None
    assert Regime(heads=64).apply(CaseSpec(heads=32)) is None


@pytest.mark.parametrize(("field", "value"), [("max_batch", 0), ("max_context", -1), ("heads", 2.5),
                                              ("head_dim", 24), ("block_size", "64")])
def test_a_bound_that_cannot_bound_is_refused_naming_its_field(field, value):
    with pytest.raises(SpecError) as caught:
        Regime(**{field: value})
    assert caught.value.field == field


def test_the_cli_names_the_flag_of_a_bad_bound(capsys):
    assert main(["fuzz", "--budget", "1", "--max-batch", "0"]) == ExitStatus.USAGE
    assert capsys.readouterr().err.startswith("difftest: error: --max-batch=0: expected None or an integer >= 1")
    assert main(["fuzz", "--budget", "1", "--backends", "torch", "--heads", "7"]) == ExitStatus.USAGE
    assert "--heads=7: expected bounds some planned case fits" in capsys.readouterr().err


def test_a_regime_campaign_draws_only_cases_inside_it_and_batches_them(tmp_path):
    stream = tmp_path / "fuzz.jsonl"
    regime = Regime(max_batch=3, max_context=64, heads=32, head_dim=64, block_size=16)
    outcome = fuzz(Campaign(budget=3.0, backends=("torch",), regime=regime, stream=stream))
    specs = [json.loads(line)["result"]["spec"] for line in stream.read_text().splitlines()]
    assert len(specs) == outcome.cases >= 64 and outcome.launches >= 1
    for spec in specs:
        assert CaseSpec.from_json(spec).total_batch <= 3 and spec["max_model_len"] <= 64, spec
        assert (spec["heads"], spec["head_dim"], spec["block_size"]) == (32, 64, 16), spec
    assert {r.verdict.value for r in outcome.results} == {"PASS"}
    assert "batched: " in render_campaign(outcome)


def test_a_batch_only_failure_is_rerun_alone_and_its_merged_case_is_the_failure(tmp_path):
    regime = Regime(max_batch=3, max_context=64, heads=32, head_dim=64, block_size=16)
    outcome = fuzz(Campaign(budget=8.0, backends=(PLANTED_BATCH,), regime=regime, until_failures=1,
                            repro_dir=tmp_path, shrink_seconds=5.0, config=RunConfig(isolate=False)))
    assert outcome.launches >= 1 and outcome.diverged
    assert {r.verdict.value for r in outcome.results} == {"PASS"}  # every case alone
    (found,) = outcome.found  # the merged case: the launch the kernel got wrong, bundled and shrunk
    assert found.case.name.startswith("batch-") and found.signature.verdict.value == "FAIL(mask)"
    assert found.bundle is not None and found.shrunk is not None
    assert found.shrunk.case.batch == 5, found.shrunk.case.describe()  # BATCH_LIMIT + 1: the planted bug
    assert "passes when tried again" in render_campaign(outcome)
    alone = [r for r in outcome.retries if r.members == 1]
    assert alone and not any(r.failed for r in alone), "every member passes alone"
    assert describe_retries(outcome.retries) in render_campaign(outcome)


def test_without_batching_no_case_is_batched():
    regime = Regime(max_batch=2, max_context=32, heads=32, head_dim=64, block_size=16)
    outcome = fuzz(Campaign(budget=1.0, backends=("torch",), regime=regime, batching=False))
    assert outcome.cases >= 1 and outcome.launches == 0 and "batched" not in render_campaign(outcome)


def test_the_rate_bench_smoke_run_writes_its_table(tmp_path):
    bench = importlib.import_module("bench.fuzz_rate")
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "fuzz_rate.json").read_text())["rows"]
    assert set(rows) == {"small", "large"} and all(row["fuzz_rate"] > 0 for row in rows.values())
    assert bench.BASELINE in (tmp_path / "fuzz_rate.md").read_text()


def test_the_rate_bench_summarizes_runs_each_against_the_one_before(tmp_path, capsys):
    bench = importlib.import_module("bench.fuzz_rate")
    for name, rate in (("a", 100.0), ("b", 150.0)):
        (tmp_path / name).mkdir()
        row = {"baseline_rate": 10.0, "fuzz_rate": rate, "ratio": rate / 10.0}
        (tmp_path / name / "fuzz_rate.json").write_text(json.dumps({"rows": {"small": row}}))
    assert bench.main(["--summarize", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| a | small | 10.0 | 100.0 | 10.0x |  |"
    assert lines[3] == "| b | small | 10.0 | 150.0 | 15.0x | 1.50x |"


def test_a_buffered_stream_holds_lines_until_its_interval_or_close(tmp_path):
    path = tmp_path / "s.jsonl"
    stream = ResultStream(path, flush_seconds=3600.0)
    stream.header({"run": 1})
    stream.header({"run": 2})
    assert path.read_text() == ""  # held: the interval has not passed
    stream.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"run": {"run": 1}}, {"run": {"run": 2}}]
