"""`difftest run --graph`: the planted graph-replay bugs fail the run with it and pass without it, a replay's
repro line draws its captured case with --graph (and no bundle holds a replay), the report records the mode, and
only paged logits takes it."""

from __future__ import annotations

import json

import pytest

from difftest.core.kinds import ExitStatus
from tests.support import run_cli

ONE_CASE = ["run", "--cases", "edges", "--case-filter", "length-one-*", "--no-progress"]


@pytest.mark.parametrize("planted", ["ReusedSchedule", "SizeByValue"])
def test_a_planted_graph_replay_bug_fails_run_graph_and_passes_run(planted, tmp_path):
    chosen = [*ONE_CASE, "--backend-module", f"tests.planted_graph:{planted}"]
    code, out, _ = run_cli(chosen)
    assert code == ExitStatus.OK and "@replay" not in out, out
    bundles = tmp_path / "bundles"
    code, out, _ = run_cli([*chosen, "--graph", "--report", str(tmp_path / "r.json"), "--repro-dir", str(bundles)])
    assert code == ExitStatus.FAILED and "on length-one-s1000@replay0 [graph replay (grow) of length-one-s1000" in out
    assert "--seed 1000 --device cpu --oracle exact --no-isolate --graph" in out, "the repro line replays the capture"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["run"]["graph"] is True and len(report["results"]) == 5, "the case and its 4 replays"
    assert not bundles.exists() or not any(bundles.iterdir()), "a replay's case is not the drawn one: no bundle"


def test_graph_is_an_option_of_paged_logits_only():
    code, _, err = run_cli(["run", "--op", "topk", "--graph"])
    assert code == ExitStatus.USAGE and "--graph" in err and "--op paged-logits only" in err, err
