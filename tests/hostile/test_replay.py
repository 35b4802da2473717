"""Replay that proves nothing must not say so with exit 0 (issue 29's red-team pass), and replaying a
bundle from inside its own folder must not import what the folder ships."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from difftest.backends import as_loaded
from difftest.core.kinds import ExitStatus
from difftest.engine.config import RunConfig
from difftest.engine.runner import run_one
from difftest.generators import CaseSpec, build_case
from difftest.records.bundle import INFO_FILE, write_bundle
from tests import planted
from tests.support import REPO_ROOT, run_cli


@pytest.fixture(scope="module")
def failing(tmp_path_factory) -> Path:
    """A bundle of the planted block-boundary bug (FAIL(mask))."""
    case = build_case(CaseSpec(lengths=(16,), heads=4, head_dim=16), 0)
    loaded = as_loaded(planted.block_boundary_off_by_one)
    return write_bundle(tmp_path_factory.mktemp("bundles"), case, run_one(loaded, case, RunConfig()), RunConfig(),
                        loaded.origin)


def test_a_replay_that_tested_nothing_does_not_exit_0(failing, tmp_path):
    """A bundle whose backend is not installed here replayed as SKIP and exited 0, as if fixed."""
    folder = tmp_path / "skips"
    shutil.copytree(failing, folder)
    info = json.loads((folder / INFO_FILE).read_text())
    info.update(backend="deepgemm", origin={"target": "deepgemm", "registered": True, "why_not": ""})
    (folder / INFO_FILE).write_text(json.dumps(info))
    code, out, err = run_cli(["replay", str(folder)])
    assert code == ExitStatus.FAILED, f"{out=} {err=}"
    assert "verdict: SKIP" in out
    assert err.startswith("difftest: error: the replay tested nothing: deepgemm skipped the case here: "), err


def test_replaying_in_the_bundles_folder_imports_nothing_it_ships(failing, tmp_path):
    """`cd BUNDLE && python -m difftest replay .` imported packages shipped in that folder (`python -m`
    puts the working folder first on sys.path): here a `torch` package."""
    folder = tmp_path / "bundle"
    shutil.copytree(failing, folder)
    marker = tmp_path / "imported.txt"
    (folder / "torch").mkdir()
    (folder / "torch" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                                   "raise ImportError('the bundle folder shadowed torch')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # tests.planted, for --backends, from the repository
    done = subprocess.run([sys.executable, "-m", "difftest", "replay", ".", "--backends",
                           "tests.planted:block_boundary_off_by_one"], cwd=folder, capture_output=True, text=True,
                          timeout=120, env=env)
    assert not marker.exists(), f"a package in the bundle's folder was imported: {done.stderr[-2000:]}"
    assert done.returncode == ExitStatus.FAILED and "verdict: FAIL(mask) (the same as recorded" in done.stdout, done


# Modules a helper interpreter imports before any code of difftest's runs: multiprocessing's fork server and
# resource tracker start as `python -c 'from multiprocessing... import main'`, and `-c` puts the working folder
# first on sys.path, so these, planted beside a bundle, ran (twice) in a replay that trusted nothing.
PLANTED_HELPER_MODULES = ("selectors.py", "multiprocessing/__init__.py")
# What the installed `difftest` command is (pip's console script): its own folder, not the working one, is first
# on the command's sys.path, so the command itself imports nothing from the working folder.
CONSOLE_SCRIPT = "import sys\nfrom difftest.cli import entry\nif __name__ == '__main__':\n    sys.exit(entry())\n"


def _planted(folder: Path, marker: Path) -> None:
    for name in PLANTED_HELPER_MODULES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n")


@pytest.mark.parametrize("command, start", [("replay", "forkserver"), ("replay", "spawn"), ("run", "forkserver")])
def test_no_helper_interpreter_imports_from_the_working_folder(failing, tmp_path, command, start):
    """`difftest replay` of a bundle recorded with isolation (naming a registered backend, so nothing needs
    trusting) and `difftest run --isolate`, run in a folder holding a `multiprocessing` package and a
    `selectors.py`: neither is imported by the fork server, the resource tracker or a spawned worker."""
    folder, marker = tmp_path / "bundle", tmp_path / "imported.txt"
    shutil.copytree(failing, folder)
    info = json.loads((folder / INFO_FILE).read_text())
    info.update(backend="torch", origin={"target": "torch", "registered": True, "why_not": ""}, isolate=True)
    (folder / INFO_FILE).write_text(json.dumps(info))
    _planted(folder, marker)
    script = tmp_path / "bin" / "difftest"
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    argv = ["replay", "."] if command == "replay" else ["run", "--isolate", "--no-progress", "--backends", "torch",
                                                        "--cases", "edges", "--case-filter", "length-one-*"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DIFFTEST_WORKER_START": start}
    done = subprocess.run([sys.executable, str(script), *argv], cwd=folder, capture_output=True, text=True,
                          timeout=300, env=env)
    assert not marker.exists(), f"imported from the working folder: {marker.read_text()!r} {done.stderr[-2000:]}"
    assert done.returncode == ExitStatus.OK, done
    assert "verdict: PASS" in done.stdout if command == "replay" else "PASS" in done.stdout, done.stdout
