"""`difftest run/fuzz/replay/shrink --op` end to end on the CPU for ragged logits and top-k: a planted bug
caught (and bundled, replayed, shrunk), a right backend passing, the report's own headline, reports that load;
top-k's and ragged logits' metamorphic relations (--metamorphic) failing a planted bug the oracle passes, through
replay and shrink; their JUnit XML and stream, written through the same outputs as paged logits."""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from difftest.backends import mutants, torch_topk, vllm_ragged
from difftest.backends.topk_mutants import TopkMutation, TorchTopkMutant
from difftest.cli import main
from difftest.core.errors import SpecError
from difftest.core.kinds import ExitStatus, OperationKind, RaggedRelation, TopkRelation
from difftest.core.verdict import Verdict
from difftest.records.bundle import load_bundle
from difftest.records.serialize import load_results, load_run_info
from difftest.workflows import operation_session
from tests.broken_topk import Aborts, Sleeps, StoppedOnThirdCall
from tests.difftest.operations.planted import EarlyMaskRagged, OracleRagged, WholeRowTopk, WrongAfterFirstTopk


@pytest.fixture
def planted(monkeypatch):
    """The planted backends, registered in the operations' tables for the test."""
    for backend in (OracleRagged, EarlyMaskRagged):
        monkeypatch.setitem(vllm_ragged.RAGGED_BACKENDS, backend.name, backend)
    monkeypatch.setitem(torch_topk.TOPK_BACKENDS, WholeRowTopk.name, WholeRowTopk)


def _bundles(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if (p / "bundle.json").exists())


def test_ragged_run_catches_the_early_mask_passes_the_right_one_and_bundles_replay_and_shrink(planted, tmp_path,
                                                                                              capsys):
    report, repro = tmp_path / "r.json", tmp_path / "repro"
    code = main(["run", "--op", "ragged-logits", "--cases", "random", "--backends",
                 "planted-right-ragged,planted-early-mask-ragged", "--report", str(report), "--repro-dir", str(repro)])
    out = capsys.readouterr().out
    assert code == ExitStatus.FAILED
    assert "-inf-mask mismatch" in out and "FAIL(mask)" in out
    results = load_results(report)
    assert {r.operation for r in results} == {OperationKind.RAGGED_LOGITS}
    by = {r.backend: {x.verdict for x in results if x.backend == r.backend} for r in results}
    assert by == {"planted-right-ragged": {Verdict.PASS}, "planted-early-mask-ragged": {Verdict.FAIL_MASK}}
    bundle = _bundles(repro)[0]
    assert load_bundle(bundle).operation == OperationKind.RAGGED_LOGITS
    assert main(["replay", str(bundle)]) == ExitStatus.FAILED
    assert "FAIL(mask)" in capsys.readouterr().out
    assert main(["shrink", str(bundle), "--seconds", "5", "--out", str(tmp_path / "small")]) == ExitStatus.OK
    small = load_bundle(_bundles(tmp_path / "small")[0])
    assert small.verdict == Verdict.FAIL_MASK and small.case.rows * small.case.keys < load_bundle(bundle).case.rows \
        * load_bundle(bundle).case.keys


def test_topk_run_catches_out_of_window_indices_with_the_selected_set_headline(planted, tmp_path, capsys):
    report, repro = tmp_path / "t.json", tmp_path / "repro"
    code = main(["run", "--op", "topk", "--cases", "random", "--backends", "torch-topk,planted-whole-row-topk",
                 "--report", str(report), "--repro-dir", str(repro)])
    out = capsys.readouterr().out
    assert code == ExitStatus.FAILED
    assert "wrong set (tokens)" in out and "rows select a wrong set" in out
    results = load_results(report)
    assert {r.verdict for r in results if r.backend == "torch-topk"} == {Verdict.PASS}
    wrong = [r for r in results if r.backend == "planted-whole-row-topk" and r.verdict.failed]
    assert wrong and all(r.selection.wrong_rows and r.selection.wrong_tokens for r in wrong)
    assert json.loads(report.read_text())["summaries"][1]["set_rows"] > 0
    bundle = _bundles(repro)[0]
    assert main(["replay", str(bundle)]) == ExitStatus.FAILED
    assert main(["shrink", str(bundle), "--seconds", "5", "--out", str(tmp_path / "small")]) == ExitStatus.OK
    small = load_bundle(_bundles(tmp_path / "small")[0])
    assert small.verdict.failed and small.case.rows * small.case.width <= load_bundle(bundle).case.rows \
        * load_bundle(bundle).case.width


def test_an_isolated_topk_run_gives_a_crash_and_a_timeout_their_verdicts_and_goes_on(monkeypatch, tmp_path, capsys):
    for backend in (Aborts, Sleeps):
        monkeypatch.setitem(torch_topk.TOPK_BACKENDS, backend.name, backend)
    report = tmp_path / "t.json"
    code = main(["run", "--op", "topk", "--cases", "random", "--isolate", "--timeout", "0.5", "--backends",
                 "aborts,sleeps,torch-topk", "--report", str(report)])
    assert code == ExitStatus.FAILED and "CRASH" in capsys.readouterr().out
    results = load_results(report)
    by = {name: {r.verdict for r in results if r.backend == name} for name in ("aborts", "sleeps", "torch-topk")}
    assert by == {"aborts": {Verdict.CRASH}, "sleeps": {Verdict.TIMEOUT}, "torch-topk": {Verdict.PASS}}
    assert len(results) == 3 * 6 and all("SIGABRT" in r.reason for r in results if r.backend == "aborts")


@pytest.mark.parametrize("command", [["run", "--cases", "random"], ["fuzz", "--budget", "2s", "--seed", "3"]])
def test_a_case_whose_drawing_runs_out_of_memory_is_a_skip_and_the_run_goes_on(monkeypatch, tmp_path, command):
    """The GPU shared with other runs: the first case cannot be drawn; its results are SKIPs that say so, no
    backend earns a verdict from it, and the run or campaign goes on to the next case."""
    real = operation_session.operation(OperationKind.TOPK)
    first: list[str] = []

    def build(spec, seed, device):
        if not first or (spec.name, seed) == tuple(first):
            first[:] = [spec.name, seed]
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 818.00 MiB (planted)")
        return real.build(spec, seed, device)

    monkeypatch.setattr(operation_session, "operation", lambda kind: dataclasses.replace(real, build=build))
    report = tmp_path / "t.json"
    assert main([command[0], "--op", "topk", *command[1:], "--backends", "torch-topk", "--report", str(report)]) \
        == ExitStatus.OK
    results = load_results(report)
    assert results[0].verdict == Verdict.SKIP and results[0].case.startswith(first[0])
    assert results[0].reason.startswith("the case ran out of memory before any call (drawing it: CUDA out of memory.")
    assert results[1:] and {r.verdict for r in results[1:]} == {Verdict.PASS}


def test_topk_envelope_run_of_torch_topk_passes(tmp_path):
    assert main(["run", "--op", "topk", "--backends", "torch-topk", "--report", str(tmp_path / "t.json")]) \
        == ExitStatus.OK
    assert load_results(tmp_path / "t.json")


@pytest.mark.parametrize("op, backends, status", [("topk", "planted-whole-row-topk", ExitStatus.FAILED),
                                                  ("ragged-logits", "planted-right-ragged", ExitStatus.OK)])
def test_fuzz_of_an_operation_draws_random_specs_within_its_budget(planted, tmp_path, op, backends, status):
    report = tmp_path / "f.json"
    assert main(["fuzz", "--op", op, "--budget", "2s", "--backends", backends, "--report", str(report),
                 "--repro-dir", str(tmp_path / "repro")]) == status
    results = load_results(report)
    assert results and {r.operation.value for r in results} == {op}


@pytest.mark.parametrize("command", [["run", "--cases", "random"], ["fuzz", "--budget", "30s"]])
def test_a_run_or_campaign_stopped_by_sigterm_keeps_what_finished_in_its_report(monkeypatch, tmp_path, capsys,
                                                                               command):
    """`timeout` ends a command with SIGTERM (the shells make it a KeyboardInterrupt): the results before it are
    in the report, marked incomplete, in the stream and in the JUnit XML, and the command says where."""
    monkeypatch.setitem(torch_topk.TOPK_BACKENDS, StoppedOnThirdCall.name, StoppedOnThirdCall)
    report, stream, junit = tmp_path / "t.json", tmp_path / "t.jsonl", tmp_path / "t.xml"
    code = main([command[0], "--op", "topk", *command[1:], "--backends", StoppedOnThirdCall.name,
                 "--report", str(report), "--stream", str(stream), "--junit", str(junit)])
    assert code == ExitStatus.INTERRUPTED
    err = capsys.readouterr().err
    assert f"interrupted after 2 results; kept in {stream}, {report}" in err, err
    loaded = json.loads(report.read_text())
    assert loaded["run"]["incomplete"] is True and [r["verdict"] for r in loaded["results"]] == ["PASS", "PASS"]
    assert [r.to_json() for r in load_results(stream)] == loaded["results"]
    assert load_run_info(stream)[0]["operation"] == "topk"
    assert ET.parse(junit).getroot().get("tests") == "2"


def _junit_cases(path: Path) -> dict[tuple[str, str], ET.Element]:
    """Each testcase of a JUnit file by (classname, name): (backend, case)."""
    return {(c.get("classname"), c.get("name")): c for c in ET.parse(path).getroot().iter("testcase")}


def _failing_said(case: ET.Element) -> str | None:
    """The message of a testcase's failure or error, None when it passed."""
    failed = case.find("failure") if case.find("failure") is not None else case.find("error")
    return None if failed is None else failed.get("message")


def test_topk_run_writes_junit_whose_testcases_are_the_reports_results(planted, tmp_path, capsys):
    report, junit = tmp_path / "t.json", tmp_path / "t.xml"
    code = main(["run", "--op", "topk", "--cases", "random", "--backends", "torch-topk,planted-whole-row-topk",
                 "--report", str(report), "--junit", str(junit)])
    assert code == ExitStatus.FAILED and f"junit: {junit}" in capsys.readouterr().out
    results, cases = load_results(report), _junit_cases(junit)
    assert sorted(cases) == sorted((r.backend, r.case) for r in results)
    root = ET.parse(junit).getroot()
    assert root.find("testsuite").get("name") == "difftest run --op topk"
    for r in results:  # a failure says the operation's own headline; the right backend passes
        said = _failing_said(cases[r.backend, r.case])
        assert said == (f"{r.verdict.value}: {r.backend} on {r.case}: {r.headline}" if r.verdict.failed else None)
    assert int(root.get("failures")) == sum(r.verdict.failed for r in results) > 0
    text = next(c.find("failure").text for c in cases.values() if c.find("failure") is not None)
    assert "wrong set (tokens)" in text and "rows select a wrong set" in text, text


def test_a_ragged_campaign_streams_every_result_and_writes_them_as_junit(planted, tmp_path, capsys):
    report, stream, junit = tmp_path / "f.json", tmp_path / "f.jsonl", tmp_path / "f.xml"
    code = main(["fuzz", "--op", "ragged-logits", "--budget", "1s", "--backends",
                 "planted-right-ragged,planted-early-mask-ragged", "--report", str(report), "--stream", str(stream),
                 "--junit", str(junit)])
    out = capsys.readouterr().out
    assert code == ExitStatus.FAILED and f"stream: {stream}\nreport: {report}\njunit: {junit}" in out, out
    results = load_results(report)
    assert [r.to_json() for r in load_results(stream)] == [r.to_json() for r in results]
    assert load_run_info(stream)[0]["operation"] == "ragged-logits"
    cases = _junit_cases(junit)
    assert ET.parse(junit).getroot().find("testsuite").get("name") == "difftest fuzz --op ragged-logits"
    assert sorted(cases) == sorted((r.backend, r.case) for r in results)
    failed = {key for key, case in cases.items() if _failing_said(case)}
    assert failed == {(r.backend, r.case) for r in results if r.verdict.failed}
    assert {backend for backend, _ in failed} == {"planted-early-mask-ragged"}


def test_a_campaign_bundles_the_first_failure_of_each_backend_and_verdict(planted, tmp_path, capsys):
    repro = tmp_path / "repro"
    assert main(["fuzz", "--op", "topk", "--budget", "2s", "--backends", "planted-whole-row-topk,torch-topk",
                 "--report", str(tmp_path / "f.json"), "--repro-dir", str(repro)]) == ExitStatus.FAILED
    failing = [r for r in load_results(tmp_path / "f.json") if r.verdict.failed]
    signatures = {(r.backend, r.verdict) for r in failing}
    assert len(failing) > len(signatures) and len(_bundles(repro)) == len(signatures)
    assert f"{len(signatures)} bundle(s) under {repro}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, flag", [(["run", "--spec", "{}"], "--spec='{}'"),
                                        (["fuzz", "--budget", "1", "--jobs", "2"], "--jobs=2"),
                                        (["fuzz", "--budget", "1", "--no-batching"], "--no-batching=False")])
def test_an_option_of_paged_logits_only_is_refused_with_the_operation(capsys, argv, flag):
    """Not ignored: a campaign of another operation has no jobs side by side nor batches."""
    assert main([argv[0], "--op", "topk", *argv[1:]]) == ExitStatus.USAGE
    assert f"{flag}: expected an option of --op paged-logits only, not of --op topk" in capsys.readouterr().err


@pytest.mark.parametrize("argv, line", [
    (["--op", "topk", "--metamorphic", "add-neg-inf,scale-q"], "--metamorphic='add-neg-inf,scale-q': expected 'all' "
     "or comma-separated relations of --op topk among ['add-neg-inf', 'permute-columns']"),
    (["--metamorphic", "permute-columns"], "--metamorphic='permute-columns': expected 'all' or comma-separated "
     "relations of --op paged-logits among ['permute-pages', "),
    (["--op", "ragged-logits", "--metamorphic", "shift-keys,add-neg-inf"], "--metamorphic='shift-keys,add-neg-inf': "
     "expected 'all' or comma-separated relations of --op ragged-logits among ['shift-keys', 'permute-rows', "
     "'scale-q', 'permute-heads', 'append-keys', 'split-rows']"),
    (["--op", "indexer", "--metamorphic"], "--metamorphic='all': expected an option of --op paged-logits, "
     "ragged-logits or topk, not of --op indexer: it has no metamorphic relations"),
])
def test_metamorphic_takes_the_relations_of_the_operation_and_refuses_others_in_one_line(capsys, argv, line):
    assert main(["run", *argv]) == ExitStatus.USAGE
    (said,) = capsys.readouterr().err.splitlines()
    assert said.startswith(f"difftest: error: {line}"), said


@pytest.fixture
def padded_past_window(monkeypatch):
    """The catalogue's top-k mutant that pads only past the window (vLLM's convention under a contract that
    promises -1 past the candidates), registered as a top-k backend for the test."""
    monkeypatch.setitem(torch_topk.TOPK_BACKENDS, "mutant-topk-padded-past-window",
                        functools.partial(mutants.topk_mutant, "topk_padded_past_window"))


def test_topk_run_with_metamorphic_fails_what_the_oracle_passes_and_its_bundle_replays_and_shrinks_so(
        padded_past_window, tmp_path, capsys):
    """The suite's windows hold no -inf, so the oracle passes the mutant; add-neg-inf puts -inf in and it returns
    them where -1 belongs."""
    report, repro = tmp_path / "t.json", tmp_path / "repro"
    code = main(["run", "--op", "topk", "--cases", "random", "--backends", "torch-topk,mutant-topk-padded-past-window",
                 "--metamorphic", "--device", "cpu", "--report", str(report), "--repro-dir", str(repro)])
    out = capsys.readouterr().out
    assert code == ExitStatus.FAILED
    assert "FAIL(metamorphic) (topk)" in out and "metamorphic: add-neg-inf does not hold on " in out
    results = load_results(report)
    by = {name: {r.verdict for r in results if r.backend == name} for name in {r.backend for r in results}}
    assert by == {"torch-topk": {Verdict.PASS}, "mutant-topk-padded-past-window": {Verdict.FAIL_METAMORPHIC}}
    failed = next(r for r in results if r.verdict.failed)
    assert [v.related for v in failed.metamorphic] == [f"{failed.case}~add-neg-inf"]
    bundle = load_bundle(_bundles(repro)[0])
    assert bundle.config.metamorphic == tuple(TopkRelation)
    assert main(["replay", str(bundle.path)]) == ExitStatus.FAILED
    assert "verdict: FAIL(metamorphic) (the same as recorded" in capsys.readouterr().out
    assert main(["shrink", str(bundle.path), "--seconds", "5", "--out", str(tmp_path / "small")]) == ExitStatus.OK
    assert "metamorphic: add-neg-inf does not hold on " in capsys.readouterr().out
    small = load_bundle(_bundles(tmp_path / "small")[0])
    assert small.verdict == Verdict.FAIL_METAMORPHIC and small.case.rows * small.case.width < bundle.case.rows \
        * bundle.case.width
    assert main(["replay", str(small.path)]) == ExitStatus.FAILED
    assert "metamorphic: add-neg-inf does not hold on 1 row; first row 0" in capsys.readouterr().out


@pytest.fixture
def tiles_from_key_0(monkeypatch):
    """The ragged mutant whose tiles are anchored to key 0 (AITER 0.1.7's bug), registered as a ragged backend."""
    monkeypatch.setitem(vllm_ragged.RAGGED_BACKENDS, "mutant-ragged-tiles-from-key-0",
                        functools.partial(mutants.ragged_mutant, "ragged_tiles_from_key_0"))


def test_ragged_run_with_shift_keys_fails_what_the_oracle_passes_and_its_bundle_replays_and_shrinks_so(
        tiles_from_key_0, tmp_path, capsys):
    """random-full's windows all start at key 0, on a tile: the oracle passes the mutant there, and shift-keys
    moves them to key 3."""
    report, repro = tmp_path / "r.json", tmp_path / "repro"
    code = main(["run", "--op", "ragged-logits", "--cases", "random", "--backends", "mutant-ragged-tiles-from-key-0",
                 "--metamorphic", "shift-keys,scale-q", "--device", "cpu", "--report", str(report), "--repro-dir",
                 str(repro)])
    out = capsys.readouterr().out
    assert code == ExitStatus.FAILED and "FAIL(metamorphic) (ragged-logits)" in out
    assert "metamorphic: shift-keys (3 keys inserted before the buffer) does not hold within rtol on " in out
    results = {r.case: r for r in load_results(report)}
    assert {case: r.verdict for case, r in results.items()} == {
        "random-windows-s0": Verdict.FAIL_MASK, "random-staircase-s0": Verdict.FAIL_MASK,
        "random-full-s0": Verdict.FAIL_METAMORPHIC}
    assert [v.related for v in results["random-full-s0"].metamorphic] == [("random-full-s0~shift-keys",)]
    bundle = next(b for b in map(load_bundle, _bundles(repro)) if b.verdict == Verdict.FAIL_METAMORPHIC)
    # scale-q read back as the ragged operation's (a paged relation has the name too)
    assert [(type(r), r.value) for r in bundle.config.metamorphic] == [(RaggedRelation, "shift-keys"),
                                                                       (RaggedRelation, "scale-q")]
    assert main(["replay", str(bundle.path)]) == ExitStatus.FAILED
    assert "verdict: FAIL(metamorphic) (the same as recorded" in capsys.readouterr().out
    assert main(["shrink", str(bundle.path), "--seconds", "5", "--out", str(tmp_path / "small")]) == ExitStatus.OK
    assert "metamorphic: shift-keys (3 keys inserted before the buffer) does not hold" in capsys.readouterr().out
    small = load_bundle(_bundles(tmp_path / "small")[0])
    assert small.verdict == Verdict.FAIL_METAMORPHIC
    assert small.case.rows * small.case.keys < bundle.case.rows * bundle.case.keys, small.case.describe()
    assert main(["replay", str(small.path)]) == ExitStatus.FAILED
    assert "metamorphic: shift-keys (3 keys inserted before the buffer) does not hold" in capsys.readouterr().out


@pytest.mark.parametrize("registered, op, backend, relation, other, known", [
    ("padded_past_window", "topk", "mutant-topk-padded-past-window", "add-neg-inf", "scale-q",
     "['add-neg-inf', 'permute-columns']"),
    ("tiles_from_key_0", "ragged-logits", "mutant-ragged-tiles-from-key-0", "shift-keys", "permute-pages",
     "['shift-keys', 'permute-rows', 'scale-q', 'permute-heads', 'append-keys', 'split-rows']"),
])
def test_a_bundle_naming_relations_of_another_operation_is_refused(request, tmp_path, registered, op, backend,
                                                                   relation, other, known):
    request.getfixturevalue(registered)
    repro = tmp_path / "repro"
    main(["run", "--op", op, "--cases", "random", "--backends", backend, "--metamorphic", relation, "--repro-dir",
          str(repro)])
    info = _bundles(repro)[0] / "bundle.json"
    info.write_text(info.read_text().replace(f'"{relation}"', f'"{other}"'))
    with pytest.raises(SpecError) as refused:
        load_bundle(info.parent)
    assert f"bundle.json metamorphic=['{other}']: expected relations of the {op} operation: {known}" in \
        str(refused.value)


def test_backends_lists_every_operation(capsys):
    assert main(["backends"]) == ExitStatus.OK
    out = capsys.readouterr().out
    for heading in ("paged-logits:", "ragged-logits:", "topk:"):
        assert heading in out
    assert "deepgemm-ragged" in out and "torch-topk" in out


def test_a_run_never_replaces_an_earlier_runs_report_unasked(tmp_path, capsys):
    """As a paged run: the report and its stream are locked while the run writes, and an earlier run's are kept
    unless --overwrite says otherwise (an operation's run cannot resume)."""
    report = tmp_path / "t.json"
    argv = ["run", "--op", "topk", "--backends", "torch-topk", "--report", str(report)]
    assert main(argv) == ExitStatus.OK
    first = report.read_text()
    assert main(argv) == ExitStatus.USAGE
    assert f"--report='{report}': expected a path no earlier run wrote (one did: overwrite it)" in \
        capsys.readouterr().err
    assert report.read_text() == first and load_results(report.with_suffix(".jsonl"))
    assert main([*argv, "--overwrite"]) == ExitStatus.OK
    assert not list(tmp_path.glob("*.lock")), "the locks go once the run is done"


def test_a_failing_result_prints_the_run_line_that_draws_it_again_and_that_line_fails_it_alone(planted, tmp_path,
                                                                                               capsys):
    assert main(["run", "--op", "topk", "--backends", "planted-whole-row-topk", "--repeat", "2"]) == ExitStatus.FAILED
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("repro: ")]
    assert lines and all(line.startswith("repro: difftest run --op topk --backends planted-whole-row-topk --cases "
                                         "envelope --seed 0 --case-filter ") for line in lines)
    assert lines[0].endswith("--device cpu --oracle exact --no-isolate --repeat 2")
    again = tmp_path / "again.json"
    assert main([*shlex.split(lines[0].removeprefix("repro: "))[1:], "--report", str(again)]) == ExitStatus.FAILED
    case = shlex.split(lines[0])[shlex.split(lines[0]).index("--case-filter") + 1]
    (result,) = load_results(again)
    assert result.case == case and result.verdict.failed


def test_a_ragged_failure_block_names_the_pattern_its_wrong_windows_follow(planted, capsys):
    assert main(["run", "--op", "ragged-logits", "--cases", "random", "--backends",
                 "planted-early-mask-ragged"]) == ExitStatus.FAILED
    assert "    pattern: (" in capsys.readouterr().out


def test_quiet_prints_the_verdict_line_alone(planted, capsys):
    assert main(["run", "--op", "topk", "--cases", "random", "--backends", "torch-topk", "--quiet"]) == ExitStatus.OK
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("PASS: ") and line.endswith("results: torch-topk PASS")


def test_case_filter_runs_the_matching_cases_and_refuses_a_glob_matching_none(planted, tmp_path, capsys):
    report = tmp_path / "t.json"
    assert main(["run", "--op", "topk", "--backends", "torch-topk", "--case-filter", "ties-*",
                 "--report", str(report)]) == ExitStatus.OK
    cases = {r.case for r in load_results(report)}
    assert cases and all(case.startswith("ties-") for case in cases)
    assert main(["run", "--op", "topk", "--case-filter", "no-such-*"]) == ExitStatus.USAGE
    assert "--case-filter='no-such-*': expected a pattern matching some of the" in capsys.readouterr().err


def test_run_repeat_3_passes_a_top_k_choosing_among_ties_and_fails_one_wrong_on_a_later_launch(monkeypatch, tmp_path,
                                                                                             capsys):
    monkeypatch.setitem(torch_topk.TOPK_BACKENDS, "random-ties",
                        functools.partial(TorchTopkMutant, TopkMutation.RANDOM_TIES, "random-ties"))
    monkeypatch.setitem(torch_topk.TOPK_BACKENDS, WrongAfterFirstTopk.name, WrongAfterFirstTopk)
    report = tmp_path / "r.json"
    assert main(["run", "--op", "topk", "--repeat", "3", "--case-filter", "ties-straddle-*", "--backends",
                 f"random-ties,{WrongAfterFirstTopk.name}", "--report", str(report)]) == ExitStatus.FAILED
    ties, wrong = load_results(report)
    assert ties.verdict == Verdict.PASS and ties.stability.kind.value == "stable-within-tolerance"
    assert wrong.verdict == Verdict.FAIL_NONDETERMINISTIC and wrong.stability.unstable_rows == [0]
    assert "unstable over 3 launches" in capsys.readouterr().out
