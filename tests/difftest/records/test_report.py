"""Reports: per-backend summaries, the headline, the table, failure lines (an error's traceback) and JSON values."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from difftest.backends.torch_ref import TorchBackend
from difftest.backends.user import FunctionBackend
from difftest.core.kinds import Isolation
from difftest.core.schema import ReportModel, validate
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import build_case
from difftest.records.report import (
    TOPK_NA_NOTE,
    TRACEBACK_LINES,
    headline,
    render_devices,
    render_failures,
    render_table,
    summarize,
    write_json,
)
from difftest.records.serialize import ResultStream, load_results, to_jsonable
from tests import broken_backends as bb
from tests import user_backends as ub
from tests.support import TINY


def _results():
    cases = [build_case(TINY.replace(next_n=3, lengths=(5, 9, 0, 20)), s) for s in range(2)]
    backends = [TorchBackend(), FunctionBackend.from_function(ub.sequence_length_for_every_row),
                FunctionBackend.from_function(ub.raises), ub.DeclaresCudaOnly()]
    return run(backends, cases, RunConfig())


def test_summaries_count_rows_and_verdicts():
    results = _results()
    by_name = {s.backend: s for s in summarize(results)}
    assert list(by_name) == ["torch", "sequence_length_for_every_row", "raises", "cuda-only"], f"{list(by_name)=}"
    torch_s, mutant, raised, skipped = by_name.values()
    assert (torch_s.cases, torch_s.rows, torch_s.mask_rows, torch_s.verdict) == (2, 24, 0, Verdict.PASS)
    # 3 sequences with L > 0, next_n - 1 = 2 wrong rows each, in each of 2 cases.
    assert (mutant.rows, mutant.mask_rows, mutant.verdict) == (24, 12, Verdict.FAIL_MASK), f"{mutant=}"
    assert headline(mutant) == "12/24 rows with the wrong -inf mask"
    assert raised.verdict == Verdict.ERROR and raised.counts == {"ERROR": 2} and raised.rows == 0, f"{raised=}"
    assert skipped.verdict == Verdict.SKIP and skipped.cases == 0 and skipped.skipped == 2, f"{skipped=}"
    assert skipped.skip_reasons == ["contract devices ['cuda'] exclude cpu"] and skipped.topk_overlap is None


def test_table_and_failures_text():
    results = _results()
    table = render_table(summarize(results)).split("\n\n")[0].splitlines()
    assert len(table) == 6 and table[0].startswith("backend") and table[5] == TOPK_NA_NOTE, f"{table=}"
    assert "12/24" in table[2] and "FAIL(mask)" in table[2], f"{table[2]=}"
    assert "SKIP: contract devices" in table[4], f"{table[4]=}"
    # Windows of at most 20 positions: a top-2048 keeps them whole, whatever the values (n/a); nothing compared: -.
    assert [line.split()[5] for line in table[1:4]] == ["n/a", "n/a", "-"], table
    failures = render_failures(results)
    assert "12/24" not in failures and "6/12 rows with the wrong -inf mask [0,1,3,4,9,10]" in failures, failures
    assert "RuntimeError: kernel exploded at launch" in failures and "cuda-only" not in failures, failures
    assert "... and 2 more failing results" in render_failures(results, limit=2)


def test_json_values_are_plain(tmp_path):
    assert to_jsonable({"a": (1, math.inf, -math.inf), "v": Verdict.PASS}) == {"a": [1, "inf", "-inf"], "v": "PASS"}
    path = write_json(tmp_path / "r.json", _results(), {"seed": 0})
    doc = json.loads(path.read_text())
    assert len(doc["results"]) == 8 and len(doc["summaries"]) == 4, f"{doc.keys()=}"
    assert doc["results"][1]["comparison"]["first_mismatch"]["kind"] == "FAIL(mask)"


H200 = "cuda:0 NVIDIA H200 (PCI 0000:{bus}:00.0, CUDA_VISIBLE_DEVICES={visible})"


def _on_gpus(results):
    """The results as if computed on two GPUs, alternately."""
    return [dataclasses.replace(r, gpu=H200.format(bus=("19", "3a")[i % 2], visible=i % 2))
            for i, r in enumerate(results)]


def test_gpu_of_each_result_round_trips_through_json_and_jsonl(tmp_path):
    results = _on_gpus(_results())
    assert load_results(write_json(tmp_path / "r.json", results, {})) == results
    stream = ResultStream(tmp_path / "r.jsonl")
    for result in results:
        stream.write(result)
    stream.close()
    assert load_results(tmp_path / "r.jsonl") == results
    assert json.loads((tmp_path / "r.json").read_text())["results"][1]["gpu"] == H200.format(bus="3a", visible=1)


def test_a_report_written_before_the_gpu_field_still_loads(tmp_path):
    results = _results()
    doc = json.loads(write_json(tmp_path / "r.json", results, {}).read_text())
    for result in doc["results"]:
        del result["gpu"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert load_results(tmp_path / "old.json") == results and all(r.gpu is None for r in results)


def test_results_per_device_only_when_more_than_one():
    results = _results()
    assert render_devices(results) == "" and render_devices(_on_gpus(results)[::2]) == ""
    assert render_devices(_on_gpus(results)) == (f"results per device: {H200.format(bus='19', visible=0)}: 4, "
                                                 f"{H200.format(bus='3a', visible=1)}: 4")


LIBRARIES = {"torch": f"torch {torch.__version__}", "sequence_length_for_every_row": "tests", "raises": "tests",
             "cuda-only": ""}


def test_each_backend_names_what_it_loaded_in_the_json_report_and_under_the_table(tmp_path):
    results = _results()
    assert {r.backend: r.library for r in results} == LIBRARIES, "each result carries its backend's Contract.library"
    doc = json.loads(write_json(tmp_path / "r.json", results, {}).read_text())
    assert {s["backend"]: s["library"] for s in doc["summaries"]} == LIBRARIES, doc["summaries"]
    assert load_results(tmp_path / "r.json") == results
    libraries = render_table(summarize(results)).split("\n\n")[1].splitlines()
    assert libraries == ["libraries loaded:", f"  {'torch':<26} {LIBRARIES['torch']}",
                         "  sequence_length_for_every_row tests", f"  {'raises':<26} tests"], libraries


def test_a_backend_whose_results_name_two_libraries_lists_both_once():
    """A resumed run whose earlier part loaded another version: the summary names both, in order."""
    results = [r for r in _results() if r.backend == "torch"]
    mixed = [dataclasses.replace(results[0], library="amd-aiter 0.1.7"),
             dataclasses.replace(results[1], library="amd-aiter main"), results[0]]
    assert summarize(mixed)[0].library == f"amd-aiter 0.1.7; amd-aiter main; {LIBRARIES['torch']}"


def test_a_report_written_before_the_library_field_still_loads(tmp_path):
    results = _results()
    doc = json.loads(write_json(tmp_path / "r.json", results, {}).read_text())
    for record in doc["results"] + doc["summaries"]:
        del record["library"]
    validate(ReportModel, doc)
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert load_results(tmp_path / "old.json") == [dataclasses.replace(r, library="") for r in results]


# --------------------------------------------------------------------------- an error's traceback

@pytest.fixture(scope="module")
def nested_errors():
    """raises_nested's ERROR, run in this process and in a worker."""
    case = build_case(TINY, 0)
    nested = FunctionBackend.from_function(bb.raises_nested)
    return [run([nested], [case], RunConfig(isolate=isolate))[0] for isolate in (False, True)]


def test_an_errors_traceback_is_in_its_failure_block_its_last_lines_unless_whole(nested_errors):
    for result in nested_errors:
        block = render_failures([result], whole_tracebacks=True)
        assert "\n    traceback:\n      Traceback (most recent call last):\n" in block, block
        assert all(line in block for line in bb.nested_traceback_lines()), block
        assert render_failures([result]) == block, "a short traceback is shown whole"
    long = dataclasses.replace(nested_errors[0], traceback="".join(f"line {i}\n" for i in range(30)))
    short = render_failures([long]).splitlines()
    assert short[2:] == [f"    traceback (its last {TRACEBACK_LINES} of 30 lines; the whole of it in the JSON report):",
                         *(f"      line {i}" for i in range(30 - TRACEBACK_LINES, 30))], short
    assert render_failures([long], whole_tracebacks=True).splitlines()[2:] == [
        "    traceback:", *(f"      line {i}" for i in range(30))]


def test_an_errors_traceback_is_in_the_json_report_and_the_stream(nested_errors, tmp_path):
    doc = json.loads(write_json(tmp_path / "r.json", nested_errors, {}).read_text())
    assert [r["traceback"] for r in doc["results"]] == [r.traceback for r in nested_errors]
    assert [r["isolation"] for r in doc["results"]] == [None, Isolation.WORKER.value]
    assert load_results(tmp_path / "r.json") == nested_errors
    stream = ResultStream(tmp_path / "r.jsonl")
    for result in nested_errors:
        stream.write(result)
    stream.close()
    assert load_results(tmp_path / "r.jsonl") == nested_errors
    for record in doc["results"]:  # a report written before the field
        del record["traceback"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert [r.traceback for r in load_results(tmp_path / "old.json")] == [None, None]
