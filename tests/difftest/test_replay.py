"""`difftest run --repro-dir`, `difftest replay` and `difftest shrink` on bundles of a planted bug."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys

import pytest
import torch

from difftest.backends import Origin, as_loaded
from difftest.bundle import load_bundle, write_bundle
from difftest.cli import main
from difftest.config import RunConfig
from difftest.kinds import ExitStatus
from difftest.replay import bundle_backend
from difftest.runner import run_one
from difftest.shrink import case_from_line
from difftest.verdict import Verdict
from generators import CaseSpec, build_case
from tests import planted

MODULE = "tests.planted:block_boundary_off_by_one"
BOUNDARY = as_loaded(planted.block_boundary_off_by_one)


@pytest.fixture(scope="module")
def run_bundles(tmp_path_factory) -> list:
    """The bundles `difftest run --repro-dir` writes for the planted backend on the edge suite."""
    folder = tmp_path_factory.mktemp("repro")
    code = main(["run", "--backends", "torch", "--backend-module", MODULE, "--cases", "edges", "--heads", "4",
                 "--head-dim", "16", "--no-progress", "--repro-dir", str(folder)])
    assert code == ExitStatus.FAILED
    return sorted(p for p in folder.iterdir())


def test_run_writes_one_bundle_per_failing_result_with_the_module_to_reload(run_bundles) -> None:
    assert run_bundles, "the edge suite has block-boundary lengths: the planted backend must fail"
    for path in run_bundles:
        bundle = load_bundle(path)
        assert bundle.backend == "planted-block-boundary" and bundle.origin == Origin(MODULE, registered=False)
        assert bundle.verdict == Verdict.FAIL_MASK
    assert any("block-boundaries" in p.name for p in run_bundles)


def test_replay_reports_the_recorded_verdict_and_exits_1(run_bundles, capsys) -> None:
    assert main(["replay", str(run_bundles[0]), "--trust-bundle"]) == ExitStatus.FAILED
    out = capsys.readouterr().out
    assert "verdict: FAIL(mask) (the same as recorded: FAIL(mask))" in out
    assert "rows with the wrong -inf mask" in out


def test_replay_by_registry_name_says_when_the_verdict_changed(tmp_path, capsys) -> None:
    case = build_case(CaseSpec(lengths=(16,), heads=4, head_dim=16), 0)
    failing = run_one(BOUNDARY, case, RunConfig())
    folder = write_bundle(tmp_path, case, dataclasses.replace(failing, backend="torch"), RunConfig(),
                          Origin("torch", registered=True))
    assert bundle_backend(load_bundle(folder)).name == "torch"
    assert main(["replay", str(folder)]) == ExitStatus.OK
    assert "verdict: PASS (differs from the recorded one: FAIL(mask))" in capsys.readouterr().out


def test_shrink_prints_the_spec_line_and_writes_a_replayable_bundle(run_bundles, tmp_path, capsys) -> None:
    source = next(p for p in run_bundles if "block-boundaries" in p.name)
    shrunk_code = main(["shrink", str(source), "--seconds", "20", "--out", str(tmp_path), "--backends", MODULE])
    assert shrunk_code == ExitStatus.OK
    lines = capsys.readouterr().out.splitlines()
    spec_line = lines[-2]
    assert json.loads(spec_line)["spec"]["lengths"] == [16], lines
    shrunk = load_bundle(next(tmp_path.iterdir()))
    assert (shrunk.case.batch, shrunk.case.seq_lens.tolist()) == (1, [16])
    assert shrunk.origin.target == MODULE and shrunk.verdict == Verdict.FAIL_MASK
    assert torch.equal(case_from_line(spec_line).q, shrunk.case.q)
    assert main(["replay", str(shrunk.path), "--backends", MODULE]) == ExitStatus.FAILED


def test_a_bundle_naming_a_module_imports_nothing_unless_trusted(run_bundles, tmp_path, capsys) -> None:
    hostile = tmp_path / "hostile"
    shutil.copytree(run_bundles[0], hostile)
    planted_file = tmp_path / "planted.txt"
    (tmp_path / "evil_backend.py").write_text(f"open({str(planted_file)!r}, 'w').write('ran')\n")
    info = json.loads((hostile / "bundle.json").read_text())
    info["origin"] = {"target": "evil_backend:anything", "registered": False, "why_not": ""}
    (hostile / "bundle.json").write_text(json.dumps(info))
    sys.path.insert(0, str(tmp_path))
    try:
        for command in ("replay", "shrink"):
            assert main([command, str(hostile)]) == ExitStatus.USAGE
            err = capsys.readouterr().err
            assert "evil_backend:anything, which replay does not import unless trusted" in err and err.count("\n") == 1
        assert not planted_file.exists(), "a bundle's module was imported without trust"
    finally:
        sys.path.remove(str(tmp_path))
