"""Hardening (issue 13, items 4-6): writes that cannot lose results, Ctrl-C, a killed parent, and
backends that try to take the runner down.

The filesystem tests mount real tiny filesystems (tmpfs) when the test runs as root and may mount;
otherwise they skip with the exact reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from difftest.backends import Origin
from difftest.backends.torch_ref import TorchBackend
from difftest.backends.user import FunctionBackend
from difftest.cli import main
from difftest.core.errors import OutputError, SpecError
from difftest.core.files import OutputLock, atomic_write
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import CaseKind, ExitStatus
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.guards import Launch
from difftest.engine.isolate import Worker
from difftest.engine.plan import SuiteRequest
from difftest.engine.runner import run
from difftest.generators import build_case
from difftest.records.serialize import load_results
from difftest.workflows.session import RunRequest, execute
from tests import broken_backends as bb
from tests.support import REPO_ROOT, TINY

CASE = TINY.replace(next_n=2, lengths=(7, 20, 0))
SMALL = ["--no-progress", "--cases", "edges", "--case-filter", "length-one-*", "--backends", "torch"]
PAIRS_PER_EDGES_RUN = 14  # the edges suite: 14 cases


def _one_line_error(capsys, code: int, want: ExitStatus) -> str:
    out, err = capsys.readouterr()
    assert code == want, f"{code=} {want=}\n{out}\n{err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, f"{err=}"
    return lines[0]


def _pairs(results) -> list[tuple[str, str]]:
    return [(r.backend, r.case) for r in results]


# --------------------------------------------------------------------------- faulty backends

FAULTY = {  # backend in tests.broken_backends -> what its ERROR's reason says
    "exits": "SystemExit: 3",
    "interrupts": "KeyboardInterrupt: raised by the backend",
    "complex_output": "contract: expected a dense torch.Tensor of shape [rows, max_model_len] = [6, 20], dtype "
                      "torch.float32 or torch.float64, on cpu, got a torch.strided tensor of shape [6, 20], "
                      "dtype torch.complex64, on cpu",
    "int_output": "dtype torch.int32",
    "wide_output": "got a torch.strided tensor of shape [6, 21]",
    "meta_output": "on cpu, got a torch.strided tensor of shape [6, 20], dtype torch.float32, on meta",
}


@pytest.mark.parametrize("name", sorted(FAULTY))
def test_each_faulty_backend_is_error_in_process_and_the_run_goes_on(name):
    case = build_case(CASE, 0)
    faulty = FunctionBackend.from_function(getattr(bb, name))
    bad, good = run([faulty, TorchBackend()], [case], RunConfig())
    assert bad.verdict == Verdict.ERROR and FAULTY[name] in bad.reason, f"{bad=}"
    assert good.verdict == Verdict.PASS, f"{good=}"
    if "contract" in FAULTY[name] or FAULTY[name].startswith(("dtype", "got", "on")):
        assert bad.reason.startswith("contract: expected ") and bad.error_type == "contract", f"{bad.reason=}"


def test_a_complex_output_was_a_pass_before_and_is_a_contract_error_now():
    """complex64 logits whose real parts are right compared equal before the output was checked."""
    (result,) = run([FunctionBackend.from_function(bb.complex_output)], [build_case(CASE, 0)], RunConfig())
    assert result.verdict == Verdict.ERROR and "torch.complex64" in result.reason, f"{result=}"


@pytest.mark.parametrize("name", ["exits", "interrupts", "complex_output"])
def test_each_faulty_backend_is_error_in_a_worker_and_the_worker_lives_on(name, tmp_path):
    case = build_case(CASE, 0)
    faulty = FunctionBackend.from_function(getattr(bb, name))
    worker = Worker(Origin(f"tests.broken_backends:{name}", registered=False), "cpu", 60.0, tmp_path / name)
    try:
        for _ in range(2):
            outcome = worker(faulty, encode(case, faulty.contract), Launch(case.rows, case.max_model_len))
            assert outcome.verdict == Verdict.ERROR and FAULTY[name].split(",")[0] in outcome.reason, f"{outcome=}"
        assert worker.started == 1, "an ERROR keeps its worker"
    finally:
        worker.stop()


def test_a_raising_unavailable_reason_is_that_backends_error_in_every_suite():
    backends = (f"tests.broken_backends:{bb.unavailable_raises.__name__}", "torch")
    for suite in (SuiteRequest(cases=CaseKind.EDGES, case_filter=("length-one-*",)),
                  SuiteRequest(case_filter=("length-one-*",))):  # the envelope suite plans it by its contract
        outcome = execute(RunRequest(suite=suite, backends=backends))
        broken = [r for r in outcome.results if r.backend == "broken-availability"]
        assert broken and all(r.verdict == Verdict.ERROR for r in broken), f"{suite=} {outcome.results=}"
        assert broken[0].reason == "unavailable_reason raised RuntimeError: driver query failed", broken[0]
        assert outcome.status == ExitStatus.FAILED
        assert any(r.backend == "torch" and r.verdict == Verdict.PASS for r in outcome.results)


def test_a_worker_that_cannot_start_in_time_is_timeout_after_its_startup_timeout(tmp_path):
    case = build_case(CASE, 0)
    torch_backend = TorchBackend()
    worker = Worker(Origin("tests.slow_import_backend:slow_import", registered=False), "cpu", 60.0, tmp_path / "w",
                    startup_timeout=1.0)
    started = time.monotonic()
    try:
        outcome = worker(torch_backend, encode(case, torch_backend.contract), Launch(case.rows, case.max_model_len))
    finally:
        worker.stop()
    assert outcome.verdict == Verdict.TIMEOUT and "within 1 s (start-up timeout)" in outcome.reason, f"{outcome=}"
    assert time.monotonic() - started < 30, "the start-up wait is the one asked for, not the import's minute"


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), 1e9])
def test_the_startup_timeout_is_bounded(value):
    with pytest.raises(SpecError, match="startup_timeout"):
        RunConfig(startup_timeout=value)


def test_a_bad_startup_timeout_flag_is_one_line_exit_2(capsys):
    line = _one_line_error(capsys, main(["run", *SMALL, "--startup-timeout", "0"]), ExitStatus.USAGE)
    assert line.startswith("difftest: error: --startup-timeout=0.0: expected"), line


# --------------------------------------------------------------------------- atomic writes and locks

def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    atomic_write(path, "new", "report")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_second_run_on_a_locked_path_is_refused_naming_the_holder(tmp_path, capsys):
    report = tmp_path / "r.json"
    # A run holds its lock (flock) while it lives: a pid in a file alone is not a holder (pids are reused).
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from difftest.core.files import OutputLock; "
                               "OutputLock(sys.argv[1], 'report').acquire(); print('held', flush=True); "
                               "time.sleep(60)", str(report)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        line = _one_line_error(capsys, main(["run", *SMALL, "--report", str(report)]), ExitStatus.IO)
        assert line.startswith(f"difftest: error: --report='{report}': another run (pid {holder.pid})"), line
        assert not report.exists(), "refused before anything ran"
        # --overwrite does not break a live run's lock either
        assert main(["run", *SMALL, "--report", str(report), "--overwrite"]) == ExitStatus.IO
    finally:
        holder.kill()
        holder.wait()


def test_a_stale_lock_is_taken_over_and_said(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    report = tmp_path / "r.json"
    (tmp_path / "r.json.lock").write_text(f"{dead.pid}\n")
    assert main(["run", *SMALL, "--report", str(report)]) == ExitStatus.OK
    err = capsys.readouterr().err
    assert f"took over the stale lock {tmp_path / 'r.json.lock'} of pid {dead.pid}" in err, err
    assert report.exists() and not (tmp_path / "r.json.lock").exists()


def test_a_second_run_on_an_earlier_runs_report_needs_overwrite(tmp_path, capsys):
    report = tmp_path / "r.json"
    assert main(["run", *SMALL, "--report", str(report)]) == ExitStatus.OK
    capsys.readouterr()
    first = report.read_text()
    line = _one_line_error(capsys, main(["run", *SMALL, "--report", str(report)]), ExitStatus.USAGE)
    assert line.startswith(f"difftest: error: --report='{report}': expected a path no earlier run wrote"), line
    assert report.read_text() == first
    assert main(["run", *SMALL, "--report", str(report), "--overwrite"]) == ExitStatus.OK
    assert json.loads(report.read_text())["results"], "overwritten with the new run"
    assert not (tmp_path / "r.json.lock").exists() and not (tmp_path / "r.jsonl.lock").exists()


def test_the_lock_is_exclusive_in_one_process(tmp_path):
    lock = OutputLock(tmp_path / "r.json", "report").acquire()
    try:
        with pytest.raises(OutputError, match=f"pid {os.getpid()}"):
            OutputLock(tmp_path / "r.json", "report").acquire()
    finally:
        lock.release()
    OutputLock(tmp_path / "r.json", "report").acquire().release()


def test_two_concurrent_runs_on_one_report_path(tmp_path):
    """A real second `difftest run` while the first (isolated, its second backend hanging) is writing
    the same report: refused, exit 3, naming the first; the first then stops on Ctrl-C with exit 130,
    its report marked incomplete, its workers gone."""
    report = tmp_path / "r.json"
    argv = [sys.executable, "-m", "difftest.cli", "run", "--no-progress", "--cases", "edges", "--backends", "torch",
            "--backend-module", "tests.broken_backends:hangs", "--isolate", "--timeout", "120",
            "--report", str(report)]
    first = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _stream_results(tmp_path / "r.jsonl") >= 1, first)
        second = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == ExitStatus.IO, second
        assert second.stderr.strip() == (f"difftest: error: --report='{report}': another run (pid {first.pid}) is "
                                         f"writing it: lock {report}.lock"), second.stderr
        assert first.poll() is None and (tmp_path / "r.json.lock").read_text() == f"{first.pid}\n"
        below = _descendants(first.pid)
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == ExitStatus.INTERRUPTED and "Traceback" not in err, err
    doc = json.loads(report.read_text())
    assert doc["run"]["incomplete"] is True and [r["backend"] for r in doc["results"]] == ["torch"], doc
    assert not (tmp_path / "r.json.lock").exists()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and [p for p in below if _running(p) and _is_python(p)]:
        time.sleep(0.1)
    assert not [p for p in below if _running(p) and _is_python(p)], "Ctrl-C took the workers along"


def _is_python(pid: int) -> bool:
    try:
        return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# --------------------------------------------------------------------------- read-only and full filesystems

def _mount_tmpfs(where: Path, options: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"mounting a tmpfs needs root: this test runs as uid {os.geteuid()}")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"`mount -t tmpfs -o {options}` was refused: {done.stderr.strip() or done.returncode}")


@pytest.fixture
def small_fs(tmp_path):
    """Mounts tiny tmpfs filesystems under tmp_path; unmounts them afterwards."""
    mounted: list[Path] = []

    def mount(name: str, options: str) -> Path:
        where = tmp_path / name
        _mount_tmpfs(where, options)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("option", ["--report", "--stream", "--repro-dir"])
def test_a_read_only_output_location_is_exit_3_before_anything_runs(small_fs, capsys, option):
    read_only = small_fs("ro", "size=64k,ro")
    target = read_only / ("bundles" if option == "--repro-dir" else "out.json")
    line = _one_line_error(capsys, main(["run", *SMALL, option, str(target)]), ExitStatus.IO)
    assert line.startswith(f"difftest: error: {option}='{target}': cannot write: Read-only file system"), line


def test_a_full_output_location_is_exit_3_before_anything_runs(small_fs, capsys):
    full = small_fs("full", "size=64k")
    _fill(full / "filler", 0)
    line = _one_line_error(capsys, main(["run", *SMALL, "--report", str(full / "r.json")]), ExitStatus.IO)
    assert line == f"difftest: error: --report='{full / 'r.json'}': cannot write: No space left on device", line


def test_a_disk_that_fills_mid_run_keeps_every_line_written_and_exits_3(small_fs, capsys):
    full = small_fs("fills", "size=64k")
    _fill(full / "filler", 4 * 4096)  # the probe, the lock, and a page or two of stream
    stream = full / "s.jsonl"
    code = main(["run", "--no-progress", "--cases", "edges", "--backends", "torch", "--stream", str(stream)])
    line = _one_line_error(capsys, code, ExitStatus.IO)
    assert line == f"difftest: error: --stream='{stream}': cannot write: No space left on device", line
    kept = load_results(stream)  # every whole line reads back; a torn last one is ignored
    assert 0 < len(kept) < PAIRS_PER_EDGES_RUN, f"{len(kept)=}"
    assert not (full / "s.jsonl.lock").exists()


def _fill(path: Path, leave: int) -> None:
    """Write `path` until its filesystem has `leave` bytes free."""
    with path.open("wb") as file:
        while True:
            free = os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize
            if free <= leave:
                return
            try:
                file.write(b"\0" * min(4096, free - leave))
                file.flush()
            except OSError:
                return


# --------------------------------------------------------------------------- Ctrl-C and resume

def _stream_results(path: Path) -> int:
    try:
        return path.read_text().count('{"result"')
    except OSError:
        return 0


def _wait_for(condition, process: subprocess.Popen, seconds: float = 120, log: Path | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if process.poll() is not None and not condition():  # ended first: say how
            said = log.read_text()[-2000:] if log else process.communicate()
            raise AssertionError(f"the run ended first, exit status {process.returncode}: {said}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm-from-timeout"])
def test_ctrl_c_keeps_what_finished_and_resume_completes_it_with_nothing_lost_or_repeated(tmp_path, capsys, signum):
    stream, report = tmp_path / "s.jsonl", tmp_path / "r.json"
    args = ["run", "--no-progress", "--cases", "edges", "--backends", "torch",
            "--backend-module", "tests.broken_backends:slow", "--stream", str(stream), "--report", str(report)]
    child = subprocess.Popen([sys.executable, "-m", "difftest.cli", *args], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _stream_results(stream) >= 5, child)
        child.send_signal(signum)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == ExitStatus.INTERRUPTED, f"{child.returncode=}\n{out}\n{err}"
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert err.strip().startswith("difftest: interrupted after ") and f"--resume {stream}" in err, err
    doc = json.loads(report.read_text())
    before = load_results(stream)
    assert doc["run"]["incomplete"] is True and 5 <= len(before) < 2 * PAIRS_PER_EDGES_RUN, doc["run"]
    assert _pairs(load_results(report)) == _pairs(before), "the report holds what the stream holds"
    assert not (tmp_path / "s.jsonl.lock").exists() and not (tmp_path / "r.json.lock").exists()

    assert main([*args, "--resume", str(stream)]) == ExitStatus.OK
    capsys.readouterr()
    after = load_results(stream)
    pairs = _pairs(after)
    assert len(pairs) == len(set(pairs)) == 2 * PAIRS_PER_EDGES_RUN, "every pair once: nothing lost or repeated"
    assert after[:len(before)] == before, "the interrupted run's lines stay as they were"
    final = json.loads(report.read_text())
    assert "incomplete" not in final["run"] and final["run"]["resumed"] == len(before), final["run"]
    assert sorted(_pairs(load_results(report))) == sorted(pairs)


def test_a_fuzz_campaign_stopped_by_sigterm_keeps_its_results_in_the_report_marked_incomplete(tmp_path):
    """`timeout` ends a campaign whose in-flight case outlasts the job: the report holds the stream's results
    (no shrinking, no bundles), and the one line says where, with no --resume (a campaign has none)."""
    stream, report = tmp_path / "f.jsonl", tmp_path / "f.json"
    args = ["fuzz", "--budget", "10m", "--backends", "torch", "--backend-module", "tests.broken_backends:slow",
            "--no-batching", "--stream", str(stream), "--report", str(report)]
    child = subprocess.Popen([sys.executable, "-m", "difftest.cli", *args], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _stream_results(stream) >= 4, child)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == ExitStatus.INTERRUPTED, f"{child.returncode=}\n{out}\n{err}"
    assert err.strip().startswith("difftest: interrupted after ") and "--resume" not in err, err
    assert f"kept in {stream}, {report}" in err, err
    doc = json.loads(report.read_text())
    assert doc["run"]["incomplete"] is True and doc["run"]["campaign"]["phases"]["shrinking"] == 0.0, doc["run"]
    assert len(load_results(report)) >= 4


# A top-k run of StartsThenHangs, which the CLI cannot name (--op runs take registered backends only): registered
# first, then the command the installed one runs.
TOPK_HANGS = ("import sys; from difftest.backends import torch_topk; from tests.broken_topk import StartsThenHangs; "
              "torch_topk.TOPK_BACKENDS[StartsThenHangs.name] = StartsThenHangs; from difftest.cli import entry; "
              "sys.exit(entry())")
# How a shell starts `command &` in a script: SIGINT ignored, which the command inherits.
SIGINT_IGNORED = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]


def _stopped_mid_call(tmp_path: Path, op: str, isolate: bool, how: str) -> tuple[subprocess.Popen, str, Path]:
    """A run stopped while its backend's call hangs, by SIGTERM (`how` 'sigterm': started as a background job
    is, SIGINT ignored) or by SIGINT to its whole process group ('sigint-to-the-group': what `kill -INT -PGID`
    does; the watching process passes it on too): the process, its stderr and its report."""
    started, report = tmp_path / "started", tmp_path / "r.json"
    outputs = ["--report", str(report), "--junit", str(tmp_path / "r.xml")]
    isolation = ["--isolate", "--timeout", "600"] if isolate else ["--no-isolate"]
    if op == "paged":
        argv = [sys.executable, "-m", "difftest", "run", "--no-progress", "--cases", "edges", "--backends", "torch",
                "--backend-module", "tests.broken_backends:starts_then_hangs", *isolation, *outputs]
    else:
        argv = [sys.executable, "-c", TOPK_HANGS, "run", "--op", "topk", "--cases", "random", "--backends",
                "torch-topk,starts-then-hangs", *isolation, *outputs]
    child = subprocess.Popen([*SIGINT_IGNORED, *argv] if how == "sigterm" else argv, cwd=REPO_ROOT,
                             env={**os.environ, "DIFFTEST_TEST_STARTED": str(started)}, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(started.exists, child)
        if how == "sigterm":
            child.send_signal(signal.SIGTERM)
        else:
            os.killpg(child.pid, signal.SIGINT)
        _, err = child.communicate(timeout=120)
    finally:
        child.kill()
    return child, err, report


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("op, how", [("paged", "sigterm"), ("topk", "sigterm"), ("topk", "sigint-to-the-group")])
def test_a_signal_during_a_backends_call_stops_the_run_with_its_report_marked_incomplete(tmp_path, op, isolate,
                                                                                         how):
    """SIGTERM during an in-process call, in a command started with SIGINT ignored, was lost (it was passed on as
    a SIGINT): the run went on to its end and exited 0. Stopped, a run exits 130 with one line, its report
    written with what finished and marked incomplete, and no lock left behind."""
    child, err, report = _stopped_mid_call(tmp_path, op, isolate, how)
    assert child.returncode == ExitStatus.INTERRUPTED, f"{child.returncode=}\n{err[-3000:]}"
    assert err.strip().startswith("difftest: interrupted after ") and err.strip().count("\n") == 0, err[-3000:]
    assert json.loads(report.read_text())["run"]["incomplete"] is True
    assert not list(tmp_path.glob("*.lock")), list(tmp_path.iterdir())


def test_a_backend_raising_keyboard_interrupt_is_no_ctrl_c(tmp_path, capsys):
    report = tmp_path / "r.json"
    code = main(["run", *SMALL, "--backend-module", "tests.broken_backends:interrupts", "--report", str(report)])
    out = capsys.readouterr().out
    assert code == ExitStatus.FAILED and "broken-interrupts" in out, out
    assert "incomplete" not in json.loads(report.read_text())["run"]


# --------------------------------------------------------------------------- a killed parent

def _descendants(pid: int) -> set[int]:
    """Every process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has ended; only its parent's wait is missing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the descendants")
def test_a_sigkilled_isolated_run_leaves_no_process_and_no_temp_folder(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    stream = tmp_path / "s.jsonl"
    argv = [sys.executable, "-m", "difftest.cli", "run", "--no-progress", "--cases", "edges", "--backends", "torch",
            "--backend-module", "tests.broken_backends:hangs", "--isolate", "--timeout", "120", "--stream", str(stream)]
    log = tmp_path / "run.log"  # what the run said, should it end before it is killed
    with log.open("wb") as out:
        parent = subprocess.Popen(argv, cwd=REPO_ROOT, env={**os.environ, "TMPDIR": str(temp)},
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        # torch's result is in while broken-hangs hangs in its worker: the workers, the reaper and
        # (where TMPDIR is short enough for its socket) the fork server are all up.
        _wait_for(lambda: _stream_results(stream) >= 1, parent, log=log)
        below = _descendants(parent.pid)
        assert len(below) >= 3, f"{below=}"
        assert list(temp.glob("difftest-run-*/difftest-workers-*")), "the workers' folder exists while the run runs"
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and ([p for p in below if _running(p)] or list(temp.iterdir())):
            time.sleep(0.1)
    finally:
        parent.kill()
    left = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in below if _running(p)}
    assert not left, f"processes left behind: {left}"
    assert not list(temp.glob("difftest-run-*")) and not list(temp.glob("pymp-*")), list(temp.iterdir())


def test_a_command_whose_process_the_out_of_memory_killer_ends_says_so_in_one_line(tmp_path):
    """SIGKILL of the command's process (the out-of-memory killer's choice, here a backend run in-process that
    kills it) was a traceback of the supervisor, which could not reinstall SIGKILL's handler to die of it."""
    stream = tmp_path / "s.jsonl"
    done = subprocess.run([sys.executable, "-m", "difftest", "run", *SMALL, "--backend-module",
                           "tests.broken_backends:killed", "--stream", str(stream)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, f"{done.returncode=} {done.stderr[-2000:]}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "killed by SIGKILL" in lines[0] and "out-of-memory killer" in lines[0], lines[0]
    assert [r.backend for r in load_results(stream)] == ["torch"], "the result before it is kept"
