"""`difftest matrix emit`: the committed examples are what the command makes, and both validate
against their CI system's published schema (check-jsonschema's vendored copies)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from difftest.core.kinds import ExitStatus
from tests.support import REPO_ROOT, run_cli

EXAMPLES = REPO_ROOT / "examples" / "ci"
MATRIX = "examples/ci/difftest.toml"
EMITTED = {"github": ("github-workflow.yml", "vendor.github-workflows"),
           "buildkite": ("buildkite-pipeline.yml", "vendor.buildkite")}
CHECK = Path(sys.executable).with_name("check-jsonschema")


@pytest.mark.parametrize("system", EMITTED)
def test_the_committed_example_is_what_emit_makes(system, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO_ROOT)  # the emitted commands name the matrix file as given
    out = tmp_path / EMITTED[system][0]
    code, _, err = run_cli(["matrix", "emit", system, "--file", MATRIX, "-o", str(out)])
    assert code == ExitStatus.OK, f"{code=} {err=}"
    assert out.read_text() == (EXAMPLES / EMITTED[system][0]).read_text(), \
        f"examples/ci/{EMITTED[system][0]} is stale: run difftest matrix emit {system} --file {MATRIX} -o ..."


@pytest.mark.skipif(not CHECK.exists() and shutil.which("check-jsonschema") is None,
                    reason="check-jsonschema is not installed (requirements-ci.txt)")
@pytest.mark.parametrize("system", EMITTED)
def test_the_example_validates_against_the_official_schema(system):
    name, schema = EMITTED[system]
    command = str(CHECK) if CHECK.exists() else "check-jsonschema"
    done = subprocess.run([command, "--builtin-schema", schema, str(EXAMPLES / name)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_one_job_per_cell_and_a_merge_job_that_waits_for_all():
    workflow = yaml.safe_load((EXAMPLES / "github-workflow.yml").read_text())
    jobs = workflow["jobs"]
    cells = [job for name, job in jobs.items() if name != "merge"]
    assert jobs["merge"]["needs"] == [name for name in jobs if name != "merge"] and jobs["merge"]["if"] == "always()"
    assert all(step.get("if") == "always()" for job in cells for step in job["steps"] if "uses" in step
               and "upload-artifact" in step["uses"]), "a cell's report is uploaded even when its job fails"
    sm90 = jobs["sm90_vllm-0_33_0_quick"]
    assert sm90["runs-on"] == ["self-hosted", "h200"], sm90
    assert any(step.get("run") == "python -m pip install vllm==0.33.0" for step in sm90["steps"]), sm90
    pipeline = yaml.safe_load((EXAMPLES / "buildkite-pipeline.yml").read_text())
    assert pipeline["steps"][-2] == {"wait": None, "continue_on_failure": True}
    assert len(pipeline["steps"]) == len(cells) + 2
