"""`difftest matrix emit`: the committed example (examples/ci, a kernel project of its own) is what the
command makes, both files validate against their CI system's published schema (check-jsonschema's
vendored copies), and every job installs difftest as [matrix.difftest] says, never the project."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from difftest.core.errors import SpecError
from difftest.core.kinds import ExitStatus
from difftest.matrix import emit
from difftest.matrix.cell import plan_matrix
from difftest.matrix.definition import load_matrix
from tests.support import REPO_ROOT, run_cli

EXAMPLE = REPO_ROOT / "examples" / "ci"  # the repository root of a kernel project: emit runs there
EMITTED = {"github": (".github/workflows/difftest-matrix.yml", "vendor.github-workflows"),
           "buildkite": (".buildkite/difftest-matrix.yml", "vendor.buildkite")}
CHECK = Path(sys.executable).with_name("check-jsonschema")
ONE_CELL = '[matrix]\nbackends = ["torch"]\n[matrix.devices.cpu]\nrunner = "ubuntu-latest"\n[matrix.suites.q]\n'


@pytest.mark.parametrize("system", EMITTED)
def test_the_committed_example_is_what_emit_makes(system, monkeypatch, tmp_path):
    monkeypatch.chdir(EXAMPLE)  # the emitted commands name the matrix file as found there
    out = tmp_path / "emitted.yml"
    code, _, err = run_cli(["matrix", "emit", system, "-o", str(out)])
    assert code == ExitStatus.OK, f"{code=} {err=}"
    name = EMITTED[system][0]
    assert out.read_text() == (EXAMPLE / name).read_text(), \
        f"examples/ci/{name} is stale: in examples/ci, difftest matrix emit {system} -o {name}"


def test_the_committed_plan_is_what_plan_prints(monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    code, out, err = run_cli(["matrix", "plan"])
    assert code == ExitStatus.OK and out == (EXAMPLE / "plan.txt").read_text(), f"{err=}\n{out}"


@pytest.mark.skipif(not CHECK.exists() and shutil.which("check-jsonschema") is None,
                    reason="check-jsonschema is not installed (requirements-ci.txt)")
@pytest.mark.parametrize("system", EMITTED)
def test_the_example_validates_against_the_official_schema(system):
    name, schema = EMITTED[system]
    command = str(CHECK) if CHECK.exists() else "check-jsonschema"
    done = subprocess.run([command, "--builtin-schema", schema, str(EXAMPLE / name)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_one_job_per_cell_each_installing_difftest_then_the_project():
    jobs = yaml.safe_load((EXAMPLE / EMITTED["github"][0]).read_text())["jobs"]
    cells = {name: job for name, job in jobs.items() if name != "merge"}
    assert jobs["merge"]["needs"] == list(cells) and jobs["merge"]["if"] == "always()", jobs["merge"]
    assert all(step.get("if") == "always()" for job in cells.values() for step in job["steps"] if "uses" in step
               and "upload-artifact" in step["uses"]), "a cell's report is uploaded even when its job fails"
    runs = [step["run"] for step in cells["sm90_vllm-0_33_0_quick"]["steps"] if "run" in step]
    assert runs[:3] == ["python -m pip install './ci/difftest-0.1.0-py3-none-any.whl[matrix]'",
                        "python -m pip install -e .", "python -m pip install vllm==0.33.0"], runs
    assert cells["sm90_vllm-0_33_0_quick"]["runs-on"] == ["self-hosted", "h200"]
    merge_runs = [step["run"] for step in jobs["merge"]["steps"] if "run" in step]
    assert merge_runs[0] == runs[0] and "python -m pip install -e ." not in merge_runs, "the merge runs no kernel"
    assert not any("'.[matrix]'" in step.get("run", "") for job in jobs.values() for step in job["steps"])
    pipeline = yaml.safe_load((EXAMPLE / EMITTED["buildkite"][0]).read_text())
    assert pipeline["steps"][-2] == {"wait": None, "continue_on_failure": True}
    assert len(pipeline["steps"]) == len(cells) + 2
    assert all(step["command"][0] == runs[0] for step in pipeline["steps"] if "command" in step)


@pytest.mark.parametrize(("table", "command"), [
    ('version = "0.2.0rc1"', "python -m pip install 'difftest[matrix]==0.2.0rc1'"),
    ('git = "https://github.com/org/difftest"\nref = "v0.1.0"',
     "python -m pip install 'difftest[matrix] @ git+https://github.com/org/difftest@v0.1.0'"),
    ('git = "git+ssh://git@github.com/org/difftest.git"',
     "python -m pip install 'difftest[matrix] @ git+ssh://git@github.com/org/difftest.git'"),
    ('wheel = "../dist/difftest-0.1.0-py3-none-any.whl"',
     "python -m pip install 'ci/../dist/difftest-0.1.0-py3-none-any.whl[matrix]'"),
], ids=["version", "git", "git-ssh", "wheel"])
def test_difftest_is_installed_as_the_matrix_file_says(table, command, tmp_path, monkeypatch):
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "difftest.toml").write_text(ONE_CELL + f"[matrix.difftest]\n{table}\n")
    monkeypatch.chdir(tmp_path)
    expected = command.replace("ci/../dist", "./dist")  # paths relative to the matrix file's folder, normalised
    assert emit.install_difftest(plan_matrix(load_matrix(Path("ci/difftest.toml")))) == expected


def test_without_a_source_emit_is_one_line_not_an_unrelated_pypi_package(tmp_path):
    """The name `difftest` on PyPI is another project's: no default may install it."""
    path = tmp_path / "difftest.toml"
    path.write_text(ONE_CELL)
    with pytest.raises(SpecError, match=r"matrix.difftest=None: expected a \[matrix.difftest\] table naming how CI "
                                        r"installs difftest: version, git \(and ref\) or wheel"):
        emit.install_difftest(plan_matrix(load_matrix(path)))


@pytest.mark.parametrize(("command", "module", "name"), [("emit", "yaml", "PyYAML"),
                                                          ("merge", "matplotlib", "matplotlib")])
def test_without_the_matrix_extra_a_command_says_what_to_install(command, module, name, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: find_spec and import both fail
    argv = ["emit", "github", "--file", str(EXAMPLE / "difftest.toml")] if command == "emit" else \
        ["merge", "--out", str(tmp_path / "m"), str(tmp_path / "report.json")]
    code, out, err = run_cli(["matrix", *argv])
    assert code == ExitStatus.USAGE and out == "", f"{code=} {out=}"
    assert err == f"difftest: error: `difftest matrix {command}` needs {name}, which is not installed: " \
        "pip install 'difftest[matrix]'\n", err
