"""The distributions as a user gets them: `python -m build` makes an sdist and a wheel from the sources;
each installs into a fresh venv. From the wheel: a project folder of its own made of the documentation's
examples (mymodule.py from docs/writing-a-backend.md, buggy.py from docs/bundles.md, test_mykernel.py
from docs/pytest-plugin.md) runs `difftest run --backend-module`, `replay`, `shrink` and the pytest
plugin, with no PYTHONPATH; and examples/ci, a kernel project of its own, runs the steps of its emitted
GitHub workflow's CPU job (install difftest, install the project, run the cell) as CI would.

Fast and offline on a 2-core CI machine: the build runs without build isolation (setuptools is already
installed), and a fresh venv gets difftest alone (`--no-deps`, or the job's own pip command with no
package index) plus a .pth naming a view of this environment's site-packages without difftest, so torch
and the other dependencies are the ones already installed instead of a second 1 GB download, and
nothing but the distribution under test can provide difftest. `--system-site-packages` would not do: it
exposes the base interpreter's site-packages, not this venv's. Paths in a .pth are searched but not
scanned for .pth files, so no editable install is active there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# What the build reads.
SOURCES = ("pyproject.toml", "README.md", "difftest", "difftest_pytest")
EXAMPLES = {"mymodule.py": "writing-a-backend.md", "buggy.py": "bundles.md", "test_mykernel.py": "pytest-plugin.md"}
BUNDLE = "bundles/drops_last_key--block-boundaries-s3000"
SHIPPED_LEDGER = "difftest/ledgers/amd-aiter-0.1.7.post2.dev18.toml"
KERNEL_PROJECT = ROOT / "examples" / "ci"
CPU_JOB, CPU_CELL = "cpu_main_quick", "cpu/main/quick"
# The emitted job's pip commands, offline: no package index (the dependencies are in the view), and the
# project's own build without isolation (pip reads PIP_NO_BUILD_ISOLATION=0 as --no-build-isolation).
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel `python -m build` makes (the wheel built from the sdist, so a file the sdist
    lacks fails here) from a copy of the sources (a build in the checkout would leave build/ there)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = dist.glob("difftest-*.tar.gz")
    (wheel,) = dist.glob("difftest-*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def wheel(dists: dict[str, Path]) -> Path:
    return dists["wheel"]


@pytest.fixture(scope="module")
def dependencies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This environment's site-packages without difftest: a folder of links to every other entry."""
    view = tmp_path_factory.mktemp("dependencies")
    for folder in map(Path, site.getsitepackages()):
        for entry in folder.iterdir():
            own = entry.name.startswith(("difftest", "__editable__")) or entry.suffix == ".pth"
            if not own and not (view / entry.name).exists():
                (view / entry.name).symlink_to(entry)
    return view


def _fresh_venv(where: Path, dependencies: Path) -> Path:
    """A venv with no difftest and no pip of its own, this environment's dependencies on its path."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "difftest-test-dependencies.pth").write_text(f"{dependencies}\n")
    return where / "bin"


@pytest.fixture(scope="module")
def venv_bin(wheel: Path, dependencies: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel, its dependencies taken from this environment (see the docstring)."""
    bin_dir = _fresh_venv(tmp_path_factory.mktemp("venv"), dependencies)
    _pip("--python", str(bin_dir / "python"), "install", "--no-deps", str(wheel))
    return bin_dir


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _example(page: str, name: str) -> str:
    """The fenced block of docs/`page` whose first line is `# name`."""
    found = re.search(rf"^```python\n(# {re.escape(name)}\n.*?)^```", (DOCS / page).read_text(), re.M | re.S)
    assert found, f"docs/{page} has no `# {name}` block"
    return found.group(1)


def _run(bin_dir: Path, project: Path, *command: str, expect: int = 0) -> str:
    """`command` in `project` with the venv first on PATH and no PYTHONPATH, as a user's shell runs it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == expect, f"{command=} {done.returncode=}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_installs_difftest_alone_with_its_ledgers(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"difftest", "difftest_pytest", "difftest-0.1.0.dist-info"}, names
    assert {SHIPPED_LEDGER, "difftest/generators/strategies.py", "difftest/oracles/fused.py"} <= set(names)


def test_a_project_of_its_own_runs_replays_shrinks_and_tests(venv_bin: Path, tmp_path: Path) -> None:
    for name, page in EXAMPLES.items():
        (tmp_path / name).write_text(_example(page, name))
    _run(venv_bin, tmp_path, "python", "-c", "import importlib.util as u; import difftest.generators, "
         "difftest.oracles; assert u.find_spec('generators') is None and u.find_spec('oracles') is None")
    out = _run(venv_bin, tmp_path, "difftest", "run", "--no-progress", "--backend-module", "buggy:drops_last_key",
               "--backends", "torch", "--case-filter", "block-boundaries-*", "--repro-dir", "bundles", expect=1)
    assert re.search(r"^drops_last_key .* 4/12 .* FAIL\(mask\)$", out, re.M), out
    assert "FAIL(mask) (the same as recorded" in _run(venv_bin, tmp_path, "difftest", "replay", BUNDLE,
                                                       "--trust-bundle", expect=1)
    shrunk = _run(venv_bin, tmp_path, "difftest", "shrink", BUNDLE, "--trust-bundle", "--seconds", "2", "--out", "min")
    assert "verdict: FAIL(mask) kept" in shrunk, shrunk
    tested = _run(venv_bin, tmp_path, "python", "-m", "pytest", "-p", "no:cacheprovider", "test_mykernel.py",
                  "--difftest-backends", "mymodule:my_kernel", "--hypothesis-profile", "difftest-ci",
                  "-k", "test_my_kernel and block-boundaries")
    assert " passed" in tested and "my_kernel: 0/" in tested, tested  # exit status 0: nothing failed


def test_the_sdist_installs_into_a_fresh_venv_with_its_ledgers(dists: dict[str, Path], dependencies: Path,
                                                                tmp_path: Path) -> None:
    bin_dir = _fresh_venv(tmp_path / "venv", dependencies)
    _pip("--python", str(bin_dir / "python"), "install", "--no-deps", "--no-build-isolation", str(dists["sdist"]))
    ledger = SHIPPED_LEDGER.removeprefix("difftest/")
    out = _run(bin_dir, tmp_path, "python", "-c", "import difftest, importlib.resources as r; "
               f"print(difftest.__file__); print(r.files('difftest').joinpath('{ledger}').is_file())")
    assert out.startswith(str(tmp_path / "venv")) and out.endswith("\nTrue\n"), out
    assert _run(bin_dir, tmp_path, "difftest", "--version").strip() == "difftest 0.1.0"


def _step(bin_dir: Path, project: Path, command: str) -> None:
    """One `run:` step of a GitHub job, as its runner runs it (bash -e), offline (OFFLINE)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | OFFLINE
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(["bash", "-e", "-c", command], cwd=project, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, f"{command=} {done.returncode=}\n{done.stdout}\n{done.stderr}"


def test_a_kernel_project_runs_its_emitted_ci_job_with_difftest_from_the_wheel(
        wheel: Path, dependencies: Path, tmp_path: Path) -> None:
    """examples/ci copied as a repository of its own, the wheel where its [matrix.difftest] says (ci/): the
    workflow emitted there is the committed one, and its CPU job's steps run in order, as GitHub's runner
    would run them, in a fresh venv. The cell runs the project's own backend with the difftest the job
    installed."""
    project = tmp_path / "myindexer"
    shutil.copytree(KERNEL_PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (project / "ci").mkdir()
    shutil.copy2(wheel, project / "ci" / wheel.name)
    assert f'wheel = "ci/{wheel.name}"' in (project / "difftest.toml").read_text(), "the example's wheel is this one"
    workflow = ".github/workflows/difftest-matrix.yml"
    subprocess.run([sys.executable, "-m", "difftest", "matrix", "emit", "github", "-o", workflow], cwd=project,
                   capture_output=True, check=True)
    emitted = (project / workflow).read_text()
    assert emitted == (KERNEL_PROJECT / workflow).read_text(), emitted
    steps = yaml.safe_load(emitted)["jobs"][CPU_JOB]["steps"]
    # The `uses:` steps: the copy is the checkout, and the cell's folder is read here instead of uploaded.
    assert [s["uses"].split("@")[0] for s in steps if "uses" in s] == ["actions/checkout", "actions/upload-artifact"]
    bin_dir = _fresh_venv(tmp_path / "venv", dependencies)
    for step in steps:
        if "run" in step:
            _step(bin_dir, project, step["run"])
    where = _run(bin_dir, project, "python", "-c", "import difftest; print(difftest.__file__)")
    assert where.startswith(str(tmp_path / "venv")), f"difftest came from {where}, not from the job's install"
    report = json.loads((project / "difftest-matrix" / CPU_JOB / "report.json").read_text())
    assert report["run"]["matrix"]["cell"] == CPU_CELL, report["run"]
    verdicts = {(r["backend"], r["verdict"]) for r in report["results"]}
    assert verdicts == {("myindexer", "PASS")} and len(report["results"]) >= 10, verdicts
