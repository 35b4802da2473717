"""Runs side by side (issue 29's red-team pass): every file a run writes is locked for it, a lock is
never seen without the pid of its holder, and a live run's temporary folder is never swept away as a
dead run's. The races are replayed deterministically: the rival acts at the moment the red team's won."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from difftest.core import files, lifetime
from difftest.core.errors import OutputError
from difftest.core.files import OutputLock
from difftest.core.kinds import ExitStatus
from tests.support import run_cli

RUN = ["run", "--no-progress", "--cases", "edges", "--case-filter", "length-one-*", "--backends", "torch"]


def test_a_junit_file_another_run_is_writing_is_refused(tmp_path):
    """Two runs, one --junit file: one run's cases were lost and both exited 0."""
    junit = tmp_path / "junit.xml"
    holder = OutputLock(junit, "junit").acquire()  # the first run, still running
    try:
        code, _, err = run_cli([*RUN, "--junit", str(junit)])
    finally:
        holder.release()
    assert code == ExitStatus.IO and "Traceback" not in err, err
    assert err.strip() == f"difftest: error: --junit='{junit}': another run (pid {os.getpid()}) is writing it: " \
                          f"lock {junit}.lock", err
    assert not junit.exists()
    code, _, err = run_cli([*RUN, "--junit", str(junit)])
    assert code == ExitStatus.OK and "<testsuites" in junit.read_text(), err
    assert not Path(f"{junit}.lock").exists()


def test_a_lock_being_made_is_never_taken_for_a_stale_one(tmp_path, monkeypatch):
    """The lock was created, then its pid written: a second run reading it in between found no pid,
    took it for stale and took it over, and both held it (1 of 3 trials). Here the rival reads at that
    very moment, every time."""
    path = tmp_path / "r.json"
    rival: dict[str, object] = {}
    write = os.write

    def rival_first(fd: int, data: bytes) -> int:
        if not rival:  # the rival acts once, when the first run writes its pid
            rival["acting"] = True
            try:
                rival["held"] = OutputLock(path, "report").acquire()
            except OutputError as exc:
                rival["refused"] = exc
        return write(fd, data)

    monkeypatch.setattr(files.os, "write", rival_first)
    try:
        first: OutputLock | OutputError = OutputLock(path, "report").acquire()
    except OutputError as exc:
        first = exc
    monkeypatch.undo()
    outcomes = [first, rival.get("held") or rival.get("refused")]
    holders = [lock for lock in outcomes if isinstance(lock, OutputLock)]
    for lock in holders:
        lock.release()
    assert len(holders) == 1, f"both runs held the lock: {first=} {rival=}"
    (refused,) = [o for o in outcomes if isinstance(o, OutputError)]
    assert f"another run (pid {os.getpid()}) is writing it" in str(refused), refused


@pytest.fixture
def temp(tmp_path: Path, monkeypatch) -> Path:
    """The temp folder, for this test only, and no run folder made yet in this process."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(lifetime, "_folder", None)
    return tmp_path


def test_a_run_folder_being_made_is_never_swept(temp, monkeypatch):
    """A run's folder was made, then its owner file written: a sweep by another run reading the owner
    file in between found no pid and removed the live run's folder (145 times in 2,000 tries). Here the
    sweep runs as the owner file is written, every time."""
    open_file = Path.open
    swept: list[Path] = []

    def sweep_first(self: Path, *args, **kwargs):
        handle = open_file(self, *args, **kwargs)
        if self.name.endswith(lifetime.OWNER) and not swept:
            handle.flush()
            swept.append(self.parent)
            lifetime.sweep(temp)  # what another run's start does
        return handle

    monkeypatch.setattr(Path, "open", sweep_first)
    folder = lifetime.run_folder()
    monkeypatch.undo()
    assert swept == [folder], swept
    assert folder.is_dir() and (folder / lifetime.OWNER).read_text().split()[0] == str(os.getpid())


@pytest.mark.parametrize("option", ["--stream", "--report"])
def test_an_operation_campaign_refuses_a_file_another_campaign_is_writing(tmp_path, option):
    """`fuzz --op` took no lock: two campaigns streaming into one file interleaved their lines."""
    path = tmp_path / "campaign.jsonl"
    holder = OutputLock(path, option[2:]).acquire()  # the first campaign, still running
    try:
        code, _, err = run_cli(["fuzz", "--op", "topk", "--budget", "1s", "--backends", "torch-topk",
                                option, str(path)])
    finally:
        holder.release()
    assert code == ExitStatus.IO and err.strip() == f"difftest: error: {option}='{path}': another run (pid " \
                                                    f"{os.getpid()}) is writing it: lock {path}.lock", err
    assert not path.exists()
    code, _, err = run_cli(["fuzz", "--op", "topk", "--budget", "1s", "--backends", "torch-topk",
                            option, str(path)])
    assert code == ExitStatus.OK and path.stat().st_size > 0 and not Path(f"{path}.lock").exists(), err
