"""Isolation: backends in worker processes survive segfaults, aborts and hangs; streams and resume.

The workers are real processes running the planted backends of tests/broken_backends.py; nothing
is faked. The fork server (one per test process) costs a couple of seconds once; workers are cheap.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from difftest.backends import Origin
from difftest.backends.torch_ref import TorchBackend
from difftest.backends.user import FunctionBackend, backend
from difftest.cli import main
from difftest.core.errors import SpecError
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import ExitStatus, Isolation, Transport
from difftest.core.schema import to_jsonable
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.guards import Execution, Launch, execute
from difftest.engine.isolate import (
    UNIX_SOCKET_PATH_MAX,
    InProcess,
    Worker,
    crash_summary,
    exit_description,
    helper_command,
    transport_for,
)
from difftest.engine.runner import run
from difftest.engine.sanitize import Finding, SanitizerReport
from difftest.generators import build_case
from difftest.records.report import write_json
from difftest.records.serialize import ResultStream, load_results
from tests import broken_backends as bb
from tests import user_backends as ub
from tests.support import REPO_ROOT, TINY

CASE_SPEC = TINY.replace(next_n=2, lengths=(7, 20, 0))
EXPECTED = {  # backend object in tests.broken_backends -> (its name, its verdict on every case)
    "segfaults": ("broken-segfaults", Verdict.CRASH),
    "aborts": ("broken-aborts", Verdict.CRASH),
    "hangs": ("broken-hangs", Verdict.TIMEOUT),
    "raises": ("broken-raises", Verdict.ERROR),
    "writes_into_inputs": ("broken-writes-inputs", Verdict.FAIL_MUTATED_INPUT),
    "leaves_row_unwritten": ("broken-unwritten-row", Verdict.FAIL_UNWRITTEN),
    "reads_past_table": ("broken-reads-past-table", Verdict.FAIL_NAN),
    "nondeterministic": ("broken-nondeterministic", Verdict.FAIL_NONDETERMINISTIC),
    "reorders_heads": ("reorders-heads", Verdict.PASS),
    "strict_raises": ("broken-raises-strict", Verdict.ERROR),  # a factory: rebuilt from its own path
}
CASE_FILTERS = ("length-one-*", "stale-canary-table-*")  # two edge cases: one short, one with stale columns
# --timeout 3: the workers of a case compute side by side, 11 of them on CI's 2 cores.
RUN_ARGS = ["run", "--backends", "torch", "--cases", "edges", "--isolate", "--timeout", "3", "--repeat", "3",
            "--no-progress",
            *[arg for name in EXPECTED for arg in ("--backend-module", f"tests.broken_backends:{name}")],
            *[arg for glob in CASE_FILTERS for arg in ("--case-filter", glob)]]
WANT = {"torch": Verdict.PASS, **dict(EXPECTED.values())}


def _fn(f) -> FunctionBackend:
    return FunctionBackend.from_function(f)


def _worker(name: str, tmp_path: Path, timeout: float = 30.0) -> Worker:
    return Worker(Origin(f"tests.broken_backends:{name}", registered=False), "cpu", timeout, tmp_path / name)


def _call(worker, backend_, case):
    return worker(backend_, encode(case, backend_.contract), Launch(case.rows, case.max_model_len))


# --------------------------------------------------------------------------- where a backend runs

def test_backend_that_cannot_be_rebuilt_runs_in_process_and_says_why():
    @backend(contract=bb.CONTRACT, name="local-oracle")
    def local(q, kv_cache, weights, context_lens, block_table, max_model_len):
        return bb.logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)

    results = run([_fn(local), TorchBackend()], [build_case(CASE_SPEC, 0)], RunConfig(isolate=True))
    assert [r.verdict for r in results] == [Verdict.PASS, Verdict.PASS], f"{results=}"
    assert results[0].isolation == Isolation.IN_PROCESS and "<locals>" in results[0].isolation_note, f"{results[0]=}"
    assert results[1].isolation == Isolation.WORKER and results[1].isolation_note is None
    assert run([TorchBackend()], [build_case(CASE_SPEC, 0)], RunConfig())[0].isolation is None


def test_a_helper_interpreter_starts_isolated_with_this_processs_sys_path():
    """The fork server's, the resource tracker's and a spawned worker's command lines (`python FLAGS -c CODE`):
    -I keeps the working folder off sys.path, and CODE first sets this process's own (a PYTHONPATH checkout's
    included), before its first import."""
    argv = ["/usr/bin/python3", "-B", "-c", "from multiprocessing.forkserver import main; main(3, 4)", "--x"]
    command = helper_command(argv, ["/checkout", "/site-packages"])
    assert command[:3] == ["/usr/bin/python3", "-B", "-I"] and command[3] == "-c" and command[5:] == ["--x"]
    first, rest = command[4].split("\n", 1)
    assert first == "import sys; sys.path[:] = ['/checkout', '/site-packages']" and rest == argv[3]
    assert helper_command(["python3", "-m", "x"], ["/p"]) == ["python3", "-m", "x"]


# --------------------------------------------------------------------------- one worker

def test_worker_gives_the_same_bits_as_in_process(tmp_path):
    case = build_case(CASE_SPEC, 0)
    torch_backend = TorchBackend()
    worker = Worker(Origin("torch", registered=True), "cpu", 30.0, tmp_path)
    try:
        isolated = _call(worker, torch_backend, case)
    finally:
        worker.stop()
    local = _call(InProcess(), torch_backend, case)
    assert isinstance(isolated, Execution) and isinstance(local, Execution), f"{isolated=} {local=}"
    assert torch.equal(isolated.outputs[0].view(torch.int64), local.outputs[0].view(torch.int64))


def test_a_worker_started_soon_answers_as_one_started_at_once(tmp_path):
    case = build_case(CASE_SPEC, 0)
    worker = Worker(Origin("torch", registered=True), "cpu", 30.0, tmp_path)
    worker.start_soon()
    try:
        isolated = _call(worker, TorchBackend(), case)
    finally:
        worker.stop()
    assert isinstance(isolated, Execution) and worker.starting is None and worker.started == 1, f"{isolated=}"


def test_a_worker_that_cannot_start_in_the_background_raises_where_it_is_used(tmp_path, monkeypatch, capfd):
    def no_process(self):
        raise OSError("no processes left")

    monkeypatch.setattr(Worker, "start", no_process)
    worker = Worker(Origin("torch", registered=True), "cpu", 30.0, tmp_path)
    worker.start_soon()
    with pytest.raises(OSError, match="no processes left"):
        _call(worker, TorchBackend(), build_case(CASE_SPEC, 0))
    worker.stop()
    assert "Traceback" not in capfd.readouterr().err, "the thread's failure printed nothing of its own"


@pytest.mark.parametrize("device, env, transport", [
    ("cpu", None, Transport.COPY), ("cpu", "cuda-ipc", Transport.COPY),  # no GPU memory to hand over on the CPU
    ("cuda", None, Transport.CUDA_IPC), ("cuda", "copy", Transport.COPY), ("cuda", "cuda-ipc", Transport.CUDA_IPC)])
def test_transport_is_cuda_ipc_on_a_gpu_unless_asked_to_copy(monkeypatch, device, env, transport):
    if env is None:
        monkeypatch.delenv("DIFFTEST_WORKER_TRANSPORT", raising=False)
    else:
        monkeypatch.setenv("DIFFTEST_WORKER_TRANSPORT", env)
    assert transport_for(device) == transport


def test_an_unknown_transport_is_a_spec_error(monkeypatch):
    monkeypatch.setenv("DIFFTEST_WORKER_TRANSPORT", "shm")
    with pytest.raises(SpecError, match="DIFFTEST_WORKER_TRANSPORT='shm': expected one of"):
        transport_for("cuda")


def test_a_worker_runs_with_the_environment_of_its_start(tmp_path, monkeypatch):
    """Workers fork from a fork server started once per process; each must still see the parent's
    environment as it is when the worker starts, not as it was when the server did."""
    monkeypatch.delenv(ub.CALL_LOG, raising=False)
    case = build_case(CASE_SPEC, 0)
    (before,) = run([_fn(ub.recorded_a)], [case], RunConfig(isolate=True))  # the fork server is up now
    assert before.verdict == Verdict.ERROR and ub.CALL_LOG in before.reason, f"{before=}"
    log = tmp_path / "calls.log"
    monkeypatch.setenv(ub.CALL_LOG, str(log))
    (after,) = run([_fn(ub.recorded_a)], [case], RunConfig(isolate=True))
    assert after.verdict == Verdict.PASS and log.read_text().startswith("recorded-a "), f"{after=}"


@pytest.mark.parametrize("name, signal_name", [("segfaults", "SIGSEGV"), ("aborts", "SIGABRT")])
def test_worker_killed_by_a_signal_is_crash_and_is_replaced(tmp_path, name, signal_name):
    case = build_case(CASE_SPEC, 0)
    worker, dying = _worker(name, tmp_path), _fn(getattr(bb, name))
    try:
        first, second = _call(worker, dying, case), _call(worker, dying, case)
    finally:
        worker.stop()
    for fault in (first, second):
        assert fault.verdict == Verdict.CRASH and f"worker killed by {signal_name}" in fault.reason, f"{fault=}"
        assert "innermost File" in fault.reason and f"in {name}" in fault.reason, f"{fault.reason=}"
    assert worker.started == 2, "a new worker for the second call"


def test_a_worker_the_out_of_memory_killer_ends_is_crash_and_is_replaced(tmp_path):
    """SIGKILL leaves no stack (faulthandler never runs): the verdict says the signal, and the next call gets a
    new worker."""
    case = build_case(CASE_SPEC, 0)
    worker, dying = _worker("killed", tmp_path), _fn(bb.killed)
    try:
        first, second = _call(worker, dying, case), _call(worker, dying, case)
    finally:
        worker.stop()
    for fault in (first, second):
        assert fault.verdict == Verdict.CRASH and "worker killed by SIGKILL during the call" in fault.reason, fault
    assert worker.started == 2, "a new worker for the second call"


def test_hung_worker_is_killed_at_the_timeout_and_replaced(tmp_path):
    case = build_case(CASE_SPEC, 0)
    worker = _worker("hangs", tmp_path, timeout=0.5)
    try:
        fault = _call(worker, _fn(bb.hangs), case)
        assert worker.process is None, "killed and forgotten"
        again = _call(worker, _fn(bb.hangs), case)
    finally:
        worker.stop()
    assert fault.verdict == again.verdict == Verdict.TIMEOUT, f"{fault=} {again=}"
    assert fault.reason == "no answer within 0.5 s; the worker was killed" and worker.started == 2


@pytest.mark.parametrize("last_first", [False, True], ids=["asked in order", "asked last first"])
def test_calls_queued_to_one_worker_get_their_own_answers_and_one_behind_a_crash_is_sent_again(tmp_path, last_first):
    """A call sent while another is in flight goes down with the process when that one crashes: the
    worker sends it again, to its replacement, and it gets its own verdict. Outcomes asked for in any
    order are each call's own (the answers before it are read first and kept)."""
    crashing, fine = build_case(CASE_SPEC, 0), build_case(TINY.replace(next_n=2, lengths=(7, 20)), 1)
    worker, backend_ = _worker("segfaults_on_three_requests", tmp_path), _fn(bb.segfaults_on_three_requests)
    calls = [(case, worker.submit(backend_, encode(case, backend_.contract), Launch(case.rows, case.max_model_len)))
             for case in (fine, crashing, fine, fine)]
    try:
        asked = {index: calls[index][1]() for index in (reversed(range(4)) if last_first else range(4))}
        outcomes = [asked[index] for index in range(4)]
    finally:
        worker.stop()
    assert [type(o).__name__ for o in outcomes] == ["Execution", "Fault", "Execution", "Execution"], f"{outcomes=}"
    assert outcomes[1].verdict == Verdict.CRASH and worker.started == 2, "one crash, one replacement"
    expected = execute(backend_, encode(fine, backend_.contract), Launch(fine.rows, fine.max_model_len))
    assert all(torch.equal(o.outputs[0], expected.outputs[0]) for o in (outcomes[0], outcomes[2], outcomes[3]))


def test_a_queued_calls_timeout_counts_from_the_answer_before_it(tmp_path):
    """Two calls of SLOW_SECONDS (0.25 s) each sent at once under a 0.45 s timeout: neither times out
    (counted from their sending, the second would)."""
    case = build_case(CASE_SPEC, 0)
    worker = Worker(Origin("tests.broken_backends:slow", registered=False), "cpu", 0.45, tmp_path / "slow")
    worker.start()
    assert worker._await_ready() is None  # the start-up is not the calls' time
    launch = Launch(case.rows, case.max_model_len)
    try:
        waits = [worker.submit(_fn(bb.slow), encode(case, bb.CONTRACT), launch) for _ in range(2)]
        outcomes = [wait() for wait in waits]
    finally:
        worker.stop()
    assert all(isinstance(o, Execution) for o in outcomes), f"{outcomes=}"


def test_the_one_call_bench_smoke_run_writes_its_table(tmp_path):
    bench = importlib.import_module("bench.one_call")
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    steps = json.loads((tmp_path / "one_call.json").read_text())["backends"]["torch"]
    assert steps[bench.BASELINE] > 0 and steps["call isolated"] > 0 and steps["call isolated, 3 queued"] > 0
    assert "isolated / in process" in (tmp_path / "one_call.md").read_text()


def test_an_isolated_run_under_a_temp_folder_too_long_for_the_fork_servers_socket_spawns_its_workers(tmp_path):
    """Under a TMPDIR whose fork-server socket path passes a Unix socket's 107 bytes, starting the fork
    server fails ("AF_UNIX path too long", a traceback): the workers are spawned instead."""
    temp = tmp_path / ("t" * (UNIX_SOCKET_PATH_MAX - len(str(tmp_path))))
    temp.mkdir()
    argv = [sys.executable, "-m", "difftest.cli", "run", "--no-progress", "--cases", "edges", "--backends", "torch",
            "--isolate", "--case-filter", "length-one-*", "--report", str(tmp_path / "r.json")]
    done = subprocess.run(argv, cwd=REPO_ROOT, env={**os.environ, "TMPDIR": str(temp)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert results and {r["isolation"] for r in results} == {Isolation.WORKER.value}, results


def test_worker_that_cannot_load_its_backend_is_error(tmp_path):
    worker = Worker(Origin("tests.broken_backends:no_such_backend", registered=False), "cpu", 30.0, tmp_path)
    try:
        fault = _call(worker, _fn(bb.raises), build_case(CASE_SPEC, 0))
    finally:
        worker.stop()
    assert fault.verdict == Verdict.ERROR and "no_such_backend" in fault.reason, f"{fault=}"
    assert fault.traceback.startswith("Traceback (most recent call last):\n") and "no_such_backend" in fault.traceback


def test_a_worker_sends_back_the_traceback_of_a_raise_two_calls_down(tmp_path):
    """Formatted in the worker, where the frames are: the same text as in-process, naming the helper and its line."""
    case = build_case(CASE_SPEC, 0)
    worker = _worker("raises_nested", tmp_path)
    try:
        isolated = _call(worker, _fn(bb.raises_nested), case)
    finally:
        worker.stop()
    local = execute(_fn(bb.raises_nested), encode(case, bb.CONTRACT), Launch(case.rows, case.max_model_len))
    assert isolated.verdict == Verdict.ERROR and isolated.traceback == local.traceback, isolated.traceback
    assert all(line in isolated.traceback for line in bb.nested_traceback_lines()), isolated.traceback
    result = run([_fn(bb.raises_nested)], [case], RunConfig(isolate=True))[0]
    assert result.isolation == Isolation.WORKER and result.traceback == local.traceback, f"{result=}"


def test_in_process_and_worker_agree_on_a_raising_backend(tmp_path):
    case = build_case(CASE_SPEC, 0)
    worker = _worker("raises", tmp_path)
    try:
        isolated = _call(worker, _fn(bb.raises), case)
    finally:
        worker.stop()
    local = execute(_fn(bb.raises), encode(case, bb.CONTRACT), Launch(case.rows, case.max_model_len))
    assert (isolated.verdict, isolated.reason) == (local.verdict, local.reason) == (
        Verdict.ERROR, "RuntimeError: launch failed: too many resources requested")


def test_exit_description_and_crash_summary(tmp_path):
    assert exit_description(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert exit_description(3) == "exited with status 3" and exit_description(None) == "did not exit"
    log = tmp_path / "w.log"
    log.write_text("terminate called after throwing an instance of 'c10::Error'\n  what():  bad launch\n"
                   "Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n"
                   '  File "/k/kernel.py", line 9 in launch\n  File "/k/run.py", line 1 in main\n\n'
                   "Extension modules: torch._C (total: 1)\n")
    assert crash_summary(log) == ("terminate called after throwing an instance of 'c10::Error' | what():  bad launch"
                                  ' | Fatal Python error: Aborted | innermost File "/k/kernel.py", line 9 in launch')
    log.write_text("one\ntwo\n\nthree\nfour\nfive\n")
    assert crash_summary(log) == "two | three | four | five"
    assert crash_summary(tmp_path / "missing.log") == ""


# --------------------------------------------------------------------------- the whole run

def _pairs(results) -> list[tuple[str, str]]:
    return [(r.backend, r.case) for r in results]


NO_GPU = "needs a CUDA GPU: torch.cuda.is_available() is False"
ON_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)]
ON_DEVICES = [  # (--device, DIFFTEST_WORKER_TRANSPORT, --timeout): a GPU's first call also loads its libraries
    pytest.param("cpu", None, "3", id="cpu"),
    pytest.param("cuda", "cuda-ipc", "10", id="cuda-ipc", marks=ON_GPU),
    pytest.param("cuda", "copy", "10", id="cuda-copy", marks=ON_GPU),
]


@pytest.mark.parametrize("device, transport, timeout", ON_DEVICES)
def test_one_run_over_every_broken_backend_gives_each_its_verdict(tmp_path, capsys, monkeypatch, device, transport,
                                                                   timeout):
    if transport:
        monkeypatch.setenv("DIFFTEST_WORKER_TRANSPORT", transport)
    report, stream = tmp_path / "run.json", tmp_path / "run.jsonl"
    argv = [*RUN_ARGS, "--device", device, "--timeout", timeout]  # the last --timeout counts
    code = main([*argv, "--report", str(report)])
    out = capsys.readouterr().out
    assert code == ExitStatus.FAILED, out
    results = load_results(report)
    cases = sorted({r.case for r in results})
    assert len(cases) == 2 and len(results) == len(WANT) * 2, f"{cases=} {len(results)=}"
    wrong = [(r.backend, r.case, r.verdict.value, r.reason) for r in results if r.verdict != WANT[r.backend]]
    assert not wrong, f"{wrong=}\n{out}"
    assert all(r.isolation == Isolation.WORKER for r in results)
    assert _pairs(load_results(stream)) == _pairs(results), "the default stream sits beside the report"
    assert "worker killed by SIGSEGV" in out and f"no answer within {timeout} s" in out, out
    for line in out.splitlines():
        name = line.split(" ")[0]
        if name in WANT and " on " not in line:
            assert WANT[name].value in line, f"{line=}"


def _streamed(path: Path) -> int:
    return sum('"result"' in line for line in path.read_text().splitlines()) if path.exists() else 0


def test_a_killed_run_resumes_without_losing_or_repeating_anything(tmp_path, capsys):
    stream, report = tmp_path / "run.jsonl", tmp_path / "final.json"
    command = [sys.executable, "-m", "difftest.cli", *RUN_ARGS, "--stream", str(stream)]
    # A session of its own, so the kill takes the fork server and the workers too.
    # TMPDIR: the killed run cannot remove its workers' log folder; let it be the test's.
    proc = subprocess.Popen(command, cwd=REPO_ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 120
    while _streamed(stream) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = load_results(stream)
    assert 4 <= len(before) < len(WANT) * 2, f"killed mid-run: {len(before)=} {proc.stderr.read()!r}"

    # The resumed run in this process: it reuses the test process's warm fork server.
    resumed = main([*RUN_ARGS, "--stream", str(stream), "--resume", str(stream), "--report", str(report)])
    assert resumed == ExitStatus.FAILED
    final, streamed = load_results(report), load_results(stream)
    assert len(final) == len(set(_pairs(final))) == len(WANT) * 2, f"{_pairs(final)=}"
    assert sorted(_pairs(streamed)) == sorted(_pairs(final)), "the stream holds each pair once"
    assert {r.backend: r.verdict for r in final} == WANT
    kept = {(r.backend, r.case): r for r in final}
    same = [json.dumps(to_jsonable(kept[(r.backend, r.case)])) == json.dumps(to_jsonable(r)) for r in before]
    assert all(same), "resumed results are reused, not re-run (compared as JSON: a NaN error is not == itself)"
    info = json.loads(report.read_text())["run"]
    assert info["resumed"] == len(before) and info["resumed_from"] == str(stream), f"{info=}"


def test_resume_from_other_options_is_a_one_line_error(tmp_path, capsys):
    stream = tmp_path / "s.jsonl"
    assert main(["run", "--backends", "torch", "--cases", "edges", "--case-filter", "length-one-*",
                 "--no-progress", "--stream", str(stream)]) == 0
    capsys.readouterr()
    code = main(["run", "--backends", "torch", "--cases", "edges", "--case-filter", "length-one-*",
                 "--heads", "16", "--no-progress", "--resume", str(stream)])
    err = capsys.readouterr().err
    assert code == ExitStatus.USAGE and err.count("\n") == 1 and "--resume=" in err and "another spec" in err, err


# --------------------------------------------------------------------------- streams

def test_stream_survives_a_torn_last_line_and_appends_after_it(tmp_path):
    (result,) = run([TorchBackend()], [build_case(CASE_SPEC, 0)], RunConfig())
    path = tmp_path / "s.jsonl"
    stream = ResultStream(path)
    stream.header({"seed": 0})
    stream.write(result)
    stream.close()
    with path.open("a") as torn:
        torn.write('{"result": {"backend": "tor')
    assert load_results(path) == [result]
    again = ResultStream(path, append=True)
    again.write(dataclasses.replace(result, case="other"))
    again.close()
    assert [r.case for r in load_results(path)] == [result.case, "other"]


def test_load_results_round_trips_every_field(tmp_path):
    results = run([TorchBackend(), _fn(bb.nondeterministic), _fn(bb.writes_into_inputs), _fn(bb.raises)],
                  [build_case(CASE_SPEC, 0)], RunConfig(repeat=2))
    found = SanitizerReport("memcheck", True, None, "compute-sanitizer ...", 99, 2,
                            (Finding("Invalid __global__ read of size 4 bytes", "k", 2, ("by thread (0,0,0)",)),), "")
    results[-1] = dataclasses.replace(results[-1], sanitizer=found, isolation="worker")
    assert load_results(write_json(tmp_path / "r.json", results, {})) == results


@pytest.mark.parametrize("text", ['{"results": [{"backend": 1}]}', 'not json\n{"run": {}}\n', '[1, 2]\n'])
def test_unreadable_resume_file_is_a_spec_error(tmp_path, capsys, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    code = main(["run", "--backends", "torch", "--cases", "edges", "--no-progress", "--resume", str(path)])
    err = capsys.readouterr().err
    assert code == ExitStatus.USAGE and err.startswith("difftest: error: --resume=") and err.count("\n") == 1, err


def test_a_json_report_is_never_appended_to_as_a_stream(tmp_path, capsys):
    report = tmp_path / "r.json"
    argv = ["run", "--backends", "torch", "--cases", "edges", "--case-filter", "length-one-*", "--no-progress"]
    assert main([*argv, "--report", str(report)]) == 0
    before = report.read_text()
    capsys.readouterr()
    assert main([*argv, "--resume", str(report), "--stream", str(report)]) == ExitStatus.USAGE
    err = capsys.readouterr().err
    assert err.startswith("difftest: error: --stream=") and err.count("\n") == 1, err
    assert report.read_text() == before


# --------------------------------------------------------------------------- the GPU script's kernels

INTERPRETED = """
from difftest.engine.comparison import compare
from difftest.core.kernel_inputs import encode
from difftest.oracles.reference import make_reference
from difftest.generators import CaseSpec, build_case
from tests.gpu_broken_backends import TritonGood, TritonOobRead

spec = CaseSpec(name="triton", batch=3, next_n=2, heads=16, head_dim=32, block_size=16, max_model_len=64,
                extra_columns=1)
case = build_case(spec, 0)
ref = make_reference(case)
for kernel in (TritonGood(), TritonOobRead()):
    got = kernel(encode(case, kernel.contract), None)
    print(kernel.name, compare(ref.logits, got, ref.row_lens, kernel.contract, ref.bound).verdict.value)
"""


def test_gpu_script_kernels_compute_the_oracle_under_the_triton_interpreter():
    """The kernels of scripts/device_visit.sh isolation, on the CPU: the control and the out-of-bounds reader
    (whose stray read is never used) match the oracle, so on the GPU only their bugs differ."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", INTERPRETED], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.split() == ["triton-good", "PASS", "triton-oob-read", "PASS"], done.stdout + done.stderr


def test_gpu_script_kernels_skip_on_the_cpu():
    from tests.gpu_broken_backends import TritonGood, TritonIllegalWrite

    results = run([TritonGood(), TritonIllegalWrite()], [build_case(CASE_SPEC, 0)], RunConfig())
    assert [r.verdict for r in results] == [Verdict.SKIP, Verdict.SKIP], f"{results=}"
    assert results[1].reason == "a Triton GPU kernel: needs --device cuda and a GPU torch can see"


def test_what_a_backend_prints_before_its_worker_dies_is_in_the_crash(tmp_path):
    """A print to stdout (block-buffered, not a terminal) just before a crash was lost from the log the CRASH
    quotes, unless PYTHONUNBUFFERED was set, which a worker's interpreter (-I) now ignores."""
    case = build_case(CASE_SPEC, 0)
    worker, dying = _worker("prints_then_aborts", tmp_path), _fn(bb.prints_then_aborts)
    try:
        fault = _call(worker, dying, case)
    finally:
        worker.stop()
    assert fault.verdict == Verdict.CRASH and bb.LAST_WORDS in fault.reason, fault
