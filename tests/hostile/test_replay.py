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
