"""difftest.lifetime: the run folder and its owner, the sweep of folders whose run was killed, and a
child that dies with its parent."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from difftest import lifetime
from difftest.kinds import CaseKind
from difftest.plan import SuiteRequest
from difftest.session import RunRequest, execute


@pytest.fixture
def temp(tmp_path: Path, monkeypatch) -> Path:
    """The temp folder, for this test only, and no run folder made yet in this process."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(lifetime, "_folder", None)
    return tmp_path


def _dead_pid() -> int:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def _run_folder(root: Path, owner: str | None) -> Path:
    folder = root / f"{lifetime.PREFIX}{owner or 'x'}-test"
    folder.mkdir()
    (folder / "leftover.log").write_text("a killed run's\n")
    if owner is not None:
        (folder / lifetime.OWNER).write_text(f"{owner}\n")
    return folder


def test_the_sweep_removes_only_the_folders_of_runs_that_no_longer_run(temp):
    dead = _run_folder(temp, f"{_dead_pid()} 1")
    reused = _run_folder(temp, f"{os.getppid()} 0")  # a live pid, but not the process that made the folder
    alive = _run_folder(temp, f"{os.getppid()} {lifetime._started(os.getppid())}")
    unowned = _run_folder(temp, None)  # its owner file not written yet
    (temp / "other-tool-folder").mkdir()
    assert sorted(lifetime.sweep(temp)) == sorted([dead, reused])
    assert sorted(p.name for p in temp.iterdir()) == sorted([alive.name, unowned.name, "other-tool-folder"])


def test_scratch_folders_live_in_the_run_folder_which_names_its_owner(temp):
    with lifetime.scratch("difftest-test-") as folder:
        assert folder.parent == lifetime.run_folder() and folder.parent.parent == temp
        assert (folder.parent / lifetime.OWNER).read_text().split() == [str(os.getpid()),
                                                                         lifetime._started(os.getpid())]
    assert not folder.exists() and lifetime.sweep(temp) == [], "the live owner's folder stays"


def test_the_next_run_sweeps_a_killed_runs_folder(temp):
    dead = _run_folder(temp, f"{_dead_pid()} 1")
    execute(RunRequest(suite=SuiteRequest(cases=CaseKind.EDGES, case_filter=("length-one-*",)), backends=("torch",)))
    assert not dead.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_that_asked_dies_with_its_parent(tmp_path):
    pid_file = tmp_path / "child.pid"
    child = ("import os, sys, time\n"
             "from difftest.lifetime import die_with_parent\n"
             "die_with_parent(os.getppid())\n"
             f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
             "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time\n"
                               f"subprocess.Popen([sys.executable, '-c', {child!r}])\ntime.sleep(60)\n"])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the child did not start"
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while lifetime.pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not lifetime.pid_alive(pid), "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()
