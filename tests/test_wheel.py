"""The wheel as a user gets it: built from the sources, installed into a fresh venv, and used from a
project folder of its own made of the documentation's examples (mymodule.py from
docs/writing-a-backend.md, buggy.py from docs/bundles.md, test_mykernel.py from docs/pytest-plugin.md):
`difftest run --backend-module`, `replay`, `shrink` and the pytest plugin, with no PYTHONPATH.

Fast and offline on a 2-core CI machine: the wheel is built without build isolation (setuptools is
already installed), and the fresh venv gets the wheel alone (`--no-deps`) plus a .pth naming this
environment's site-packages, so torch and the other dependencies are the ones already installed
instead of a second 1 GB download. `--system-site-packages` would not do: it exposes the base
interpreter's site-packages, not this venv's. Paths in a .pth are searched but not scanned for .pth
files, so the repository's editable install stays invisible there.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# What the build reads.
SOURCES = ("pyproject.toml", "README.md", "difftest", "difftest_pytest")
EXAMPLES = {"mymodule.py": "writing-a-backend.md", "buggy.py": "bundles.md", "test_mykernel.py": "pytest-plugin.md"}
BUNDLE = "bundles/drops_last_key--block-boundaries-s3000"
SHIPPED_LEDGER = "difftest/ledgers/amd-aiter-0.1.7.post2.dev18.toml"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the sources (a build in the checkout would leave build/ there)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(dist), str(src))
    (built,) = dist.glob("difftest-*.whl")
    return built


@pytest.fixture(scope="module")
def venv_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel, its dependencies taken from this environment (see the docstring)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    _pip("--python", str(python), "install", "--no-deps", str(wheel))
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "difftest-test-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv / "bin"


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
