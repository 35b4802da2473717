"""One list of output writers: each result goes to every writer (the stream at once, a bundle for each
failure), and at the end each writes its whole file; one that cannot write does not cost the others theirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from difftest.backends import get_backends
from difftest.core.errors import OutputError
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import build_case
from difftest.records.bundle import load_bundle
from difftest.records.outputs import BundleOutput, JUnitOutput, Outputs, ReportOutput, StreamOutput
from difftest.records.serialize import load_results, load_run_info
from tests.support import TINY


@pytest.fixture(scope="module")
def made():
    backends = get_backends(["torch", "tests.user_backends:window_one_short"])
    case = build_case(TINY.replace(lengths=(3, 9)), 0)
    return backends, case, run(backends, [case], RunConfig())


def test_every_writer_gets_each_result_and_writes_its_file_at_the_end(made, tmp_path: Path):
    backends, case, results = made
    outputs = Outputs([StreamOutput(tmp_path / "r.jsonl", {"seed": 0}), None,
                       BundleOutput(tmp_path / "bundles", RunConfig(), backends),
                       ReportOutput(tmp_path / "r.json"), JUnitOutput(tmp_path / "j.xml", "suite")])
    for result in results:
        outputs.take(result, case)
    written = outputs.finish(results, {"seed": 0})
    assert written == {"stream": tmp_path / "r.jsonl", "repro_dir": tmp_path / "bundles",
                       "report": tmp_path / "r.json", "junit": tmp_path / "j.xml"}
    assert [r.verdict for r in load_results(tmp_path / "r.jsonl")] == [r.verdict for r in results]
    assert load_run_info(tmp_path / "r.jsonl") == [{"seed": 0}]
    assert len(load_results(tmp_path / "r.json", "report")) == 2
    [bundle] = outputs.of(BundleOutput).written  # the failure's only
    assert load_bundle(bundle).backend == "window-one-short"
    assert 'classname="window-one-short"' in (tmp_path / "j.xml").read_text()


class _FullDisk(ReportOutput):
    """A report whose disk is full by the end of the run."""

    def finish(self, results, info):
        raise OutputError(self.field, self.path, "cannot write: No space left on device")


def test_a_writer_that_cannot_write_does_not_cost_the_others_theirs(made, tmp_path: Path):
    _backends, _case, results = made
    outputs = Outputs([_FullDisk(tmp_path / "r.json"), JUnitOutput(tmp_path / "j.xml", "suite")])
    with pytest.raises(OutputError) as caught:
        outputs.finish(results, {})
    assert caught.value.field == "report" and (tmp_path / "j.xml").exists()


def test_bundles_with_first_of_keep_the_first_failure_of_each_key_only(made, tmp_path: Path):
    backends, case, results = made
    failing = next(r for r in results if r.verdict.failed)
    bundles = BundleOutput(tmp_path / "bundles", RunConfig(), backends, first_of=lambda r: (r.backend, r.verdict))
    for result in [*results, failing]:
        bundles.take(result, case)
    assert len(bundles.written) == 1


def test_a_stopped_run_keeps_what_finished_in_its_report_and_says_where(made, tmp_path: Path):
    _backends, _case, results = made
    outputs = Outputs([ReportOutput(tmp_path / "r.json"), JUnitOutput(tmp_path / "j.xml", "suite")])
    stopped = outputs.stopped(results[:1], {"seed": 0}, resumable=False, streamed=tmp_path / "elsewhere.jsonl")
    assert (stopped.results, stopped.kept) == (1, (str(tmp_path / "elsewhere.jsonl"), str(tmp_path / "r.json")))
    assert load_run_info(tmp_path / "r.json") == [{"seed": 0, "incomplete": True}]
    assert len(load_results(tmp_path / "r.json", "report")) == 1
