"""Repro lines reproduce: every line difftest prints to paste back for a case recorded on a GPU (by `run`'s
failure blocks, `fuzz`, `shrink`, `replay` and `difftest.check`) carries every option that shaped the case,
and parses with difftest's own parser back to those options. No GPU is needed to format a line: the case,
its result and its bundle are made here as a cuda run records them."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from difftest import cli
from difftest.backends import Loaded, get_backends
from difftest.core.case import Case
from difftest.core.kinds import CacheLayout, LengthEncoding, OracleKind
from difftest.core.spec import CaseSpec
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.plan import PlannedCase
from difftest.engine.result import CaseResult
from difftest.generators import build_case
from difftest.records.bundle import INFO_FILE, load_bundle, write_bundle
from difftest.records.commands import run_command
from difftest.records.report import render_failures
from difftest.records.run_info import Phases
from difftest.workflows import checking, session
from difftest.workflows.fuzz import CampaignOutcome, Found, render_campaign
from difftest.workflows.replay import render_replay
from difftest.workflows.shrink import ShrinkResult
from difftest.workflows.signatures import signature
from tests.support import TINY

TARGET = "tests.user_backends:window_one_short"  # a backend from a module path: the line must carry the path
# Every option that shapes a case's verdict, none at its default: a line that drops one is caught.
CONFIG = RunConfig(device="cuda", encoding=LengthEncoding.PER_SEQUENCE, layout=CacheLayout.TOKEN_INTERLEAVED,
                   isolate=True, timeout=42.5, repeat=3, oracle=OracleKind.EXACT, startup_timeout=120.0)
OPTIONS = ("--backends", "--spec", "--seed", "--device", "--oracle", "--encoding", "--layout", "--isolate",
           "--timeout", "--startup-timeout", "--repeat")
SPEC, SEED = TINY.replace(name="recorded", next_n=2, lengths=(7, 20, 0)), 17
SHRUNK_SPEC, SHRUNK_SEED = SPEC.replace(name="recorded-min", lengths=(7,)), 0


def _recorded(case: Case) -> CaseResult:
    """A FAIL(mask) of the module backend on `case`, as a run on an H200 records it."""
    return CaseResult(backend="window-one-short", case=case.name, description=case.describe(), rows=case.rows,
                      verdict=Verdict.FAIL_MASK, device="cuda", encoding=LengthEncoding.PER_SEQUENCE,
                      layout=CacheLayout.TOKEN_INTERLEAVED, overridden=True, seconds=0.01,
                      spec=case.meta["spec"], gpu="cuda:0 NVIDIA H200 (PCI 0000:19:00.0)")


def _lines_of(text: str, prefix: str) -> list[str]:
    return [line.strip().removeprefix(prefix) for line in text.splitlines() if line.strip().startswith(prefix)]


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[str, str]:
    """Each line printed to run the recorded case (or its shrunk one) again, by who prints it."""
    folder = tmp_path_factory.mktemp("recorded")
    loaded: Loaded = get_backends([TARGET])[0]
    case, small = build_case(SPEC, SEED), build_case(SHRUNK_SPEC, SHRUNK_SEED)
    result = _recorded(case)
    bundle = write_bundle(folder, case, result, CONFIG, loaded.origin, loaded.contract.library)
    shrunk = ShrinkResult(original=case, case=small, result=_recorded(small), spec=SHRUNK_SPEC, seed=SHRUNK_SEED,
                          probes=9, seconds=1.0, finished=True)
    found = Found(signature(result), case, result, loaded.origin, seen=1, bundle=bundle)
    shrunk_found = Found(signature(result), case, result, loaded.origin, seen=1, bundle=bundle, shrunk=shrunk,
                         shrunk_bundle=write_bundle(folder, small, shrunk.result, CONFIG, loaded.origin))
    campaign = render_campaign(CampaignOutcome([result], [found, shrunk_found], 1, 1.0, phases=Phases(1.0, 0.5, 1.5),
                                               budget=2.0, config=CONFIG))
    run_repro = session.repro_lines([result], [PlannedCase(SPEC, SEED)], [loaded], CONFIG)
    loaded_bundle = load_bundle(bundle)
    fuzz_repro, fuzz_replay = _lines_of(campaign, "repro: "), _lines_of(campaign, "replay: ")
    return {
        "run failure block": _lines_of(render_failures([result], repro=run_repro), "repro: ")[0],
        "fuzz, found": fuzz_repro[0], "fuzz, shrunk": fuzz_repro[1],
        "fuzz, bundle": fuzz_replay[0], "fuzz, shrunk bundle": fuzz_replay[1],
        "shrink of the bundle": shrunk.summary(TARGET, loaded_bundle.config).splitlines()[-1],
        "replay": _lines_of(render_replay(loaded_bundle, result), "repro: ")[0],
        "bundle.json": json.loads((bundle / INFO_FILE).read_text())["replay"],
        "check": checking.replay_command(loaded, case, result, CONFIG, None),
        "check, with a repro dir": checking.replay_command(loaded, case, result, CONFIG, folder / "check"),
    }


DRAWN = {"run failure block": (SPEC, SEED), "fuzz, found": (SPEC, SEED), "fuzz, shrunk": (SHRUNK_SPEC, SHRUNK_SEED),
         "shrink of the bundle": (SHRUNK_SPEC, SHRUNK_SEED), "replay": (SPEC, SEED), "check": (SPEC, SEED)}
REPLAYED = {"fuzz, bundle": (SPEC, SEED), "fuzz, shrunk bundle": (SHRUNK_SPEC, SHRUNK_SEED),
            "bundle.json": (SPEC, SEED), "check, with a repro dir": (SPEC, SEED)}


@pytest.mark.parametrize("who", DRAWN)
def test_a_run_line_carries_every_option_and_parses_back_to_them(printed, who):
    words = shlex.split(printed[who])
    assert words[:2] == ["difftest", "run"] and all(option in words for option in OPTIONS), words
    request = cli._run_request(cli.parse_args(words[1:]))
    spec, seed = DRAWN[who]
    assert request.config == CONFIG, "the device, oracle, encoding, layout, isolation, timeouts and repeat"
    assert (request.backends, request.suite.spec, request.suite.seed) == ((TARGET,), spec, seed)


@pytest.mark.parametrize("who", REPLAYED)
def test_a_replay_line_names_a_bundle_that_records_every_option(printed, who):
    words = shlex.split(printed[who])
    args = cli.parse_args(words[1:])
    assert (words[0], args.command, args.trust_bundle) == ("difftest", "replay", True), words
    bundle = load_bundle(args.bundle)
    spec, seed = REPLAYED[who]
    assert bundle.config == CONFIG and bundle.origin.target == TARGET
    assert (CaseSpec.from_json(bundle.case.meta["spec"]), bundle.case.meta["seed"]) == (spec, seed)
    assert bundle.info.gpu == "cuda:0 NVIDIA H200 (PCI 0000:19:00.0)", "the GPU it ran on, not this host's"


def test_options_at_their_defaults_are_written_out_where_a_default_depends_on_the_device():
    words = shlex.split(run_command("torch", CaseSpec(), 0, RunConfig()))
    assert words[words.index("--device"):] == ["--device", "cpu", "--oracle", "exact", "--no-isolate"]
    assert cli._run_request(cli.parse_args(words[1:])).config == RunConfig(isolate=False, oracle=OracleKind.EXACT)


def test_a_bundle_written_before_the_oracle_and_repeat_were_recorded_loads_with_the_defaults(tmp_path: Path):
    loaded = get_backends(["torch"])[0]
    case = build_case(SPEC, SEED)
    folder = write_bundle(tmp_path, case, _recorded(case), RunConfig(), loaded.origin)
    info = json.loads((folder / INFO_FILE).read_text())
    for key in ("oracle", "repeat", "startup_timeout"):
        del info[key]
    (folder / INFO_FILE).write_text(json.dumps(info))
    assert load_bundle(folder).config == RunConfig()


def test_a_failure_block_of_run_ends_with_a_line_that_runs_the_case_again(capsys):
    spec = json.dumps({"name": "pasted", "lengths": [16, 3], "max_model_len": 32})
    assert cli.main(["run", "--backends", "tests.planted:block_boundary_off_by_one", "--spec", spec, "--seed", "4",
                     "--no-progress"]) == 1
    [line] = _lines_of(capsys.readouterr().out, "repro: ")
    assert cli.main([*shlex.split(line)[1:], "--no-progress"]) == 1, "pasted, it fails again"
    assert _lines_of(capsys.readouterr().out, "repro: ") == [line], "and prints the same line"
