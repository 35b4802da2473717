"""Spreading a run: --shard selection, the GPU of each child, and whole --gpus runs on the CPU.

The CPU has no GPUs to spread over, so the whole runs call cmd_run with the environments --gpus
would hand its children; the children are real `python -m difftest.cli` processes, and the one that
dies is killed by a real SIGSEGV (tests.broken_backends:segfaults_on_gpu_1 on CUDA_VISIBLE_DEVICES=1).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from difftest.cli import cmd_run, main, parse_args
from difftest.core.errors import SpecError
from difftest.core.kinds import ExitStatus
from difftest.core.lifetime import sweep
from difftest.records.serialize import load_results
from difftest.workflows.spread import child_argv, gpu_environments, visible_devices_for_shard
from tests.difftest.test_hardening import _descendants, _running, _wait_for
from tests.support import REPO_ROOT

ONE_GPU_EACH = [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
EDGES = ["run", "--backends", "torch", "--cases", "edges", "--no-progress"]


def _cases(report: Path) -> list[str]:
    return [r.case for r in load_results(report)]


def test_shard_option_takes_every_nth_case_after_the_filter(tmp_path: Path, capsys) -> None:
    argv = [*EDGES, "--case-filter", "*-s*[13579]000"]  # the edges with an odd seed, in plan order
    assert main([*argv, "--report", str(tmp_path / "all.json")]) == 0
    for index in range(3):
        assert main([*argv, "--shard", f"{index}/3", "--report", str(tmp_path / f"{index}.json")]) == 0
    capsys.readouterr()
    plan = _cases(tmp_path / "all.json")
    assert len(plan) >= 5, f"{plan=}"
    assert [_cases(tmp_path / f"{index}.json") for index in range(3)] == [plan[i::3] for i in range(3)]
    assert json.loads((tmp_path / "1.json").read_text())["run"]["shard"] == "1/3"


# --------------------------------------------------------------------------- --gpus

@pytest.mark.parametrize(("shard", "gpus", "parent", "visible"), [
    (0, 2, None, "0"), (1, 2, None, "1"), (3, 4, None, "3"),
    (0, 2, "2,5", "2"), (1, 2, "2,5", "5"), (1, 2, " 2, 5 ", "5"), (0, 1, "2,5", "2"),
    (1, 2, "GPU-aaaa,GPU-bbbb", "GPU-bbbb"),
])
def test_visible_devices_for_shard(shard: int, gpus: int, parent: str | None, visible: str) -> None:
    assert visible_devices_for_shard(shard, gpus, parent) == visible


@pytest.mark.parametrize("parent", ["2,5", "", "7"])
def test_more_gpus_than_the_parent_sees_is_a_spec_error(parent: str) -> None:
    with pytest.raises(SpecError) as info:
        visible_devices_for_shard(0, 3, parent)
    assert info.value.field == "gpus" and f"CUDA_VISIBLE_DEVICES={parent!r}" in str(info.value), f"{info.value=}"


def test_gpu_environments() -> None:
    assert gpu_environments(2, "cuda", 2, "2,5") == [{"CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "5"}]
    assert gpu_environments(2, "cuda", 8, None) == ONE_GPU_EACH
    for gpus, device, count in [(0, "cuda", 2), (2, "cpu", 2), (3, "cuda", 2)]:
        with pytest.raises(SpecError) as info:
            gpu_environments(gpus, device, count, None)
        assert info.value.field == "gpus" and info.value.value == gpus, f"{gpus=} {device=} {count=}: {info.value}"


def test_child_argv_drops_what_only_the_parent_does(tmp_path: Path) -> None:
    argv = ["run", "--gpus", "2", "--report", "r.json", "--seed", "3", "--stream=s.jsonl", "--gpus=4",
            "--case-filter", "length-*", "--device", "cuda"]
    assert child_argv(argv, 1, 2, tmp_path / "part.jsonl") == [
        "run", "--seed", "3", "--case-filter", "length-*", "--device", "cuda",
        "--shard", "1/2", "--stream", str(tmp_path / "part.jsonl"), "--no-progress"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpus", "2"], "--gpus=2: expected device 'cuda' as well"),
    (["--gpus", "0"], "--gpus=0: expected an integer >= 1"),
    (["--shard", "2/2"], "--shard='2/2': expected I/N with 0 <= I < N"),
    (["--shard", "one/two"], "--shard='one/two': expected I/N with 0 <= I < N"),
])
def test_bad_gpus_or_shard_is_one_line_exit_2(capsys, argv: list[str], message: str) -> None:
    assert main([*EDGES, *argv]) == ExitStatus.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"difftest: error: {message}") and err.count("\n") == 1, err


def test_run_options_are_never_abbreviated(capsys) -> None:
    """A child's command line is its parent's less --gpus, --report and --stream: an abbreviation would slip by."""
    assert main([*EDGES, "--gpu", "2"]) == ExitStatus.USAGE
    assert "unrecognized arguments: --gpu" in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "option"), [(["--shard", "0/2"], "shard"), (["--resume", "r.jsonl"], "resume")])
def test_spread_refuses_shard_and_resume(extra: list[str], option: str) -> None:
    with pytest.raises(SpecError) as info:
        cmd_run(parse_args([*EDGES, *extra]), shard_envs=ONE_GPU_EACH)
    assert info.value.field == option and "not spread" in str(info.value), f"{info.value}"


# --------------------------------------------------------------------------- whole spread runs

def _verdicts(report: Path) -> list[tuple[str, str, str]]:
    return [(r.backend, r.case, r.verdict.value) for r in load_results(report)]


def test_two_shards_give_the_unsharded_verdicts_case_for_case(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO_ROOT)  # the children import tests.user_backends from the working directory
    argv = [*EDGES, "--backend-module", "tests.user_backends:window_one_short", "--case-filter", "*-s*[02468]000"]
    assert main([*argv, "--report", str(tmp_path / "one.json")]) == ExitStatus.FAILED
    capsys.readouterr()
    spread = [*argv, "--report", str(tmp_path / "two.json")]
    assert cmd_run(parse_args(spread), shard_envs=ONE_GPU_EACH) == ExitStatus.FAILED
    out = capsys.readouterr().out
    one, two = _verdicts(tmp_path / "one.json"), _verdicts(tmp_path / "two.json")
    assert two == one, f"{two=}\n{one=}\n{out}"
    assert {verdict for _, _, verdict in one} == {"PASS", "FAIL(mask)"}, f"{one=}"
    assert load_results(tmp_path / "two.jsonl") == load_results(tmp_path / "two.json"), "the stream beside the report"
    cases = list(dict.fromkeys(case for _, case, _ in one))
    shards = json.loads((tmp_path / "two.json").read_text())["run"]["shards"]
    assert [(s["env"], s["died"], s["results"]) for s in shards] == [
        (env, False, 2 * len(cases[i::2])) for i, env in enumerate(ONE_GPU_EACH)], f"{shards=}"
    assert "shard 1/2 (CUDA_VISIBLE_DEVICES=1): exited with status 1" in out and "FAIL(mask)" in out, out


def test_a_dead_child_is_reported_and_the_other_shard_kept(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the resumed run below is this process
    first_four = ("all-padding-*", "length-one-*", "shorter-than-next-n-*", "block-boundaries-*")
    argv = [*EDGES, "--backend-module", "tests.broken_backends:segfaults_on_gpu_1",
            *[word for glob in first_four for word in ("--case-filter", glob)]]
    status = cmd_run(parse_args([*argv, "--report", str(tmp_path / "r.json")]), shard_envs=ONE_GPU_EACH)
    assert status == ExitStatus.FAILED
    out = capsys.readouterr().out
    assert "shard 0/2 (CUDA_VISIBLE_DEVICES=0): exited with status 0, 4 of 4 results" in out, out
    assert "shard 1/2 (CUDA_VISIBLE_DEVICES=1) died: killed by SIGSEGV, 1 of 4 results: " in out, out
    assert "Fatal Python error: Segmentation fault" in out and "segfaults_on_gpu_1" in out, out
    results = load_results(tmp_path / "r.json")
    # Shard 0 ran the plan's first and third cases; shard 1 streamed torch on the second, then died.
    assert [(r.backend, r.case) for r in results] == [
        ("torch", "all-padding-s0"), ("broken-on-gpu-1", "all-padding-s0"), ("torch", "length-one-s1000"),
        ("torch", "shorter-than-next-n-s2000"), ("broken-on-gpu-1", "shorter-than-next-n-s2000")], f"{results=}"
    assert all(r.verdict.value == "PASS" and r.gpu is None for r in results), f"{results=}"
    dead = json.loads((tmp_path / "r.json").read_text())["run"]["shards"][1]
    assert dead["died"] and dead["exit"] == "killed by SIGSEGV" and dead["expected"] == 4, f"{dead=}"
    # The dead shard's cases run again in one process (no CUDA_VISIBLE_DEVICES=1 here), the rest kept.
    assert main([*argv, "--resume", str(tmp_path / "r.json"), "--report", str(tmp_path / "all.json")]) == 0
    assert len(load_results(tmp_path / "all.json")) == 8
    assert json.loads((tmp_path / "all.json").read_text())["run"]["resumed"] == 5


# --------------------------------------------------------------------------- a spread parent interrupted or killed

# `difftest run` as a spread parent on the CPU: cmd_run with the environments --gpus would hand its children.
SPREAD_PARENT = ("import functools, sys\n"
                 "from difftest import cli\n"
                 f"cli.cmd_run = functools.partial(cli.cmd_run, shard_envs={ONE_GPU_EACH!r})\n"
                 "sys.exit(cli.main(sys.argv[1:]))\n")
FIRST_FOUR = ("all-padding-*", "length-one-*", "shorter-than-next-n-*", "block-boundaries-*")
# Shard 0 makes its 4 results; shard 1 streams torch on its first case, then hangs.
HANGING = [*EDGES, "--backend-module", "tests.broken_backends:hangs_on_gpu_1",
           *[word for glob in FIRST_FOUR for word in ("--case-filter", glob)]]


def _spread_parent(argv: list[str], temp: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SPREAD_PARENT, *argv], cwd=REPO_ROOT,
                            env={**os.environ, "TMPDIR": str(temp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def _streamed(temp: Path) -> list[int]:
    """Results each shard has streamed into the parent's part folder so far."""
    counts = []
    for index in range(2):
        paths = list(temp.glob(f"difftest-run-*/difftest-shards-*/shard-{index}.jsonl"))
        counts.append(paths[0].read_text().count('{"result"') if paths else 0)
    return counts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sigkilled_spread_parent_takes_its_children_along_and_the_next_run_sweeps_its_folder(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    parent = _spread_parent([*HANGING, "--report", str(tmp_path / "r.json")], temp)
    try:
        _wait_for(lambda: _streamed(temp) == [4, 1], parent)
        below = _descendants(parent.pid)
        assert len(below) >= 1, f"{below=}"  # shard 1, hanging (shard 0 may have ended)
        parent.kill()
        parent.wait(30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_running(p) for p in below):
            time.sleep(0.05)
    finally:
        parent.kill()
    left = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in below if _running(p)}
    assert not left, f"children left running: {left}"
    (folder,) = temp.glob("difftest-run-*")  # nothing in the killed run could remove it: the next run does
    assert (folder / "owner").read_text().split()[0] == str(parent.pid)
    assert sweep(temp) == [folder] and not folder.exists()


def test_ctrl_c_in_a_spread_run_writes_what_finished_and_resume_completes_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the resumed run below hangs nowhere
    temp, report = tmp_path / "tmp", tmp_path / "r.json"
    temp.mkdir()
    parent = _spread_parent([*HANGING, "--report", str(report)], temp, start_new_session=True)
    try:
        _wait_for(lambda: _streamed(temp) == [4, 1], parent)
        os.killpg(parent.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the parent and its children
        _, err = parent.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == ExitStatus.INTERRUPTED and "Traceback" not in err, err
    assert err.strip() == (f"difftest: interrupted after 5 results; kept in {report}, {tmp_path / 'r.jsonl'} "
                           f"(--resume {report} continues it)"), err
    doc = json.loads(report.read_text())
    assert doc["run"]["incomplete"] is True and len(doc["run"]["shards"]) == 2, doc["run"]
    before = load_results(report)
    assert len(before) == 5 and load_results(tmp_path / "r.jsonl") == before
    assert not list(temp.glob("difftest-run-*")), "an interrupted run removes its folders itself"

    assert main([*HANGING, "--resume", str(report), "--report", str(tmp_path / "all.json")]) == ExitStatus.OK
    capsys.readouterr()
    after = load_results(tmp_path / "all.json")
    pairs = [(r.backend, r.case) for r in after]
    assert len(pairs) == len(set(pairs)) == 8, f"nothing lost or repeated: {pairs=}"
    assert all(result in after for result in before), "the interrupted run's results are kept as they were"
    assert json.loads((tmp_path / "all.json").read_text())["run"]["resumed"] == 5
