"""difftest.core.lifetime: the run folder and its owner, the sweep of folders whose run was killed, a
child that dies with its parent, and the wrapper whose process group dies with its parent (its
SIGKILL is tested through difftest.engine.sanitize, in test_sanitize.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from difftest.core import lifetime
from difftest.core.kinds import CaseKind
from difftest.engine.plan import SuiteRequest
from difftest.workflows.session import RunRequest, execute


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
             "from difftest.core.lifetime import die_with_parent\n"
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


def _wrapped(parent: int, *argv: str) -> list[str]:
    return [sys.executable, "-m", "difftest.core.lifetime", "--parent", str(parent), "--", *argv]


def test_the_wrapper_runs_its_argv_in_a_process_group_of_its_own_and_passes_on_its_exit_status():
    reports_its_group = "import os, sys\nprint(os.getpgid(0))\nsys.exit(7)\n"
    wrapper = subprocess.Popen(_wrapped(os.getpid(), sys.executable, "-c", reports_its_group),
                               stdout=subprocess.PIPE, text=True)
    out, _ = wrapper.communicate(timeout=60)
    assert (wrapper.returncode, out.strip()) == (7, str(wrapper.pid)), f"{out=} {wrapper.pid=} {os.getpgid(0)=}"
    killed = subprocess.run(_wrapped(os.getpid(), sys.executable, "-c", "import os\nos.kill(os.getpid(), 9)"),
                            timeout=60)
    assert killed.returncode == 128 + 9, f"a signal's death as a shell says it: {killed=}"


def test_the_wrapper_exits_at_once_when_its_parent_is_gone_and_says_when_argv_cannot_run(tmp_path):
    ran = tmp_path / "ran"
    orphan = subprocess.run(_wrapped(_dead_pid(), sys.executable, "-c", f"open({str(ran)!r}, 'w')"), timeout=60)
    assert orphan.returncode == lifetime.ORPHANED != 0 and not ran.exists(), f"{orphan=}"
    missing = subprocess.run(_wrapped(os.getpid(), str(tmp_path / "no-such-program")), capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == lifetime.CANNOT_RUN and "no-such-program" in missing.stderr, f"{missing=}"
