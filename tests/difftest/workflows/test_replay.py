"""`difftest run --repro-dir`, `difftest replay` and `difftest shrink` on bundles of a planted bug."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import signal
import subprocess
import sys

import pytest

from difftest.backends import Origin, as_loaded
from difftest.cli import main
from difftest.core.kinds import ExitStatus
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run, run_one
from difftest.generators import CaseSpec, build_case
from difftest.records.bundle import load_bundle, write_bundle
from difftest.workflows.replay import bundle_backend
from tests import broken_backends, planted
from tests.support import run_cli

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


def test_shrink_prints_a_run_line_that_pastes_and_writes_a_replayable_bundle(run_bundles, tmp_path) -> None:
    source = next(p for p in run_bundles if "block-boundaries" in p.name)
    shrunk_code, out, _ = run_cli(["shrink", str(source), "--seconds", "20", "--out", str(tmp_path / "min"),
                                   "--backends", MODULE])
    assert shrunk_code == ExitStatus.OK
    lines = out.splitlines()
    command = shlex.split(lines[-2])
    assert command[:4] == ["difftest", "run", "--backends", MODULE], lines
    spec = json.loads(command[command.index("--spec") + 1])
    assert spec["name"] == "block-boundaries-min" and spec["lengths"] == [16], lines
    shrunk = load_bundle(next((tmp_path / "min").iterdir()))
    assert (shrunk.case.batch, shrunk.case.seq_lens.tolist()) == (1, [16])
    assert shrunk.origin.target == MODULE and shrunk.verdict == Verdict.FAIL_MASK
    assert shrunk.case.name == f"block-boundaries-min-s{command[command.index('--seed') + 1]}", shrunk.case.name
    assert main(["replay", str(shrunk.path), "--backends", MODULE]) == ExitStatus.FAILED
    # The printed line, pasted as it is: the same case, the same verdict.
    report = tmp_path / "again.json"
    code, again, _ = run_cli([*command[1:], "--no-progress", "--report", str(report)])
    (result,) = json.loads(report.read_text())["results"]
    assert code == ExitStatus.FAILED and result["verdict"] == "FAIL(mask)", again
    assert result["case"] == shrunk.case.name, f"{result['case']=}"


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



def test_a_crash_recorded_under_isolation_replays_as_a_verdict(tmp_path, capsys) -> None:
    # Replay runs the backend where the bundle's config ran it: here a worker, which the crash takes down.
    crashes = as_loaded(broken_backends.segfaults_past_64)
    case = build_case(CaseSpec(lengths=(65,), heads=4, head_dim=16), 0)
    config = RunConfig(isolate=True)
    (crashed,) = run([crashes], [case], config)
    assert crashed.verdict == Verdict.CRASH, crashed.reason
    folder = write_bundle(tmp_path, case, crashed, config, crashes.origin)
    assert main(["replay", str(folder), "--trust-bundle"]) == ExitStatus.FAILED
    assert "verdict: CRASH (the same as recorded: CRASH)" in capsys.readouterr().out
    # --no-isolate runs it in the replaying process (a sanitizer's replay must): the crash is that process's
    alone = subprocess.run([sys.executable, "-m", "difftest.cli", "replay", str(folder), "--trust-bundle",
                            "--no-isolate"], capture_output=True, timeout=120)
    assert alone.returncode == -signal.SIGSEGV, alone.stderr[-500:]


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_replay_prints_the_whole_traceback_of_an_error(tmp_path, capsys, isolate) -> None:
    nested = as_loaded(broken_backends.raises_nested)
    case = build_case(CaseSpec(lengths=(5,), heads=4, head_dim=16), 0)
    config = RunConfig(isolate=isolate)
    (raised,) = run([nested], [case], config)
    folder = write_bundle(tmp_path, case, raised, config, nested.origin)
    assert main(["replay", str(folder), "--trust-bundle"]) == ExitStatus.FAILED
    out = capsys.readouterr().out
    assert "verdict: ERROR (the same as recorded: ERROR)" in out and "    traceback:\n" in out, out
    assert all(line in out for line in broken_backends.nested_traceback_lines()), out
