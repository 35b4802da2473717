"""Planted broken backends for the isolation and guard tests: `--backend-module tests.broken_backends:<name>`.

Each is right (the oracle's formula on the bytes it is handed: per-row lengths, block-split cache)
except for one way real kernels break, and each break has exactly one verdict:

    segfaults             CRASH (SIGSEGV)             hangs                  TIMEOUT
    aborts                CRASH (SIGABRT)             raises                 ERROR
    killed                CRASH (SIGKILL, as the out-of-memory killer ends a process)
    prints_then_aborts    CRASH (SIGABRT), the line it printed to stdout quoted
    raises_nested         ERROR, raised two calls down (its traceback names _launch_nested)
    writes_into_inputs    FAIL(mutated-input)         leaves_row_unwritten   FAIL(unwritten)
    reads_past_table      FAIL(nan)                   nondeterministic       FAIL(nondeterministic) with --repeat
    reorders_heads        PASS, stable within tolerance with --repeat
    strict_raises         ERROR; a factory whose backend only its own path rebuilds (isolate.recipe)
    segfaults_on_gpu_1    PASS, but CRASH (SIGSEGV) in a process whose CUDA_VISIBLE_DEVICES is 1
    segfaults_past_64     CRASH (SIGSEGV) where a row's window passes 64 keys, else PASS: a crash to shrink
    hangs_on_gpu_1        PASS, but never returns in a process whose CUDA_VISIBLE_DEVICES is 1

and the faults the runner must survive, each ERROR: exits (SystemExit), interrupts (a KeyboardInterrupt of
its own), complex_output / int_output / wide_output / meta_output (ERROR "contract: expected ..., got ..."),
unavailable_raises (its unavailable_reason raises). slow is right, after SLOW_SECONDS: a run to interrupt;
starts_then_hangs says it has started, then hangs: a call to interrupt.

segfaults, aborts, killed and hangs take the process down with them: run them only under isolation (or,
segfaults_on_gpu_1, in a child of a spread run, to kill that child; hangs_on_gpu_1 keeps one shard of
a spread run busy while its parent is interrupted or killed).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import os
import signal
import time

import torch

from difftest.backends.user import FunctionBackend, backend
from difftest.core.contract import Contract
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from tests.user_backends import logits_with_limits

CONTRACT = Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                    mask=MaskConvention.TAIL_NEG_INF, rtol=1e-6, library="tests.broken_backends")
HANG_SECONDS = 3600
_LAUNCHES = itertools.count(1)  # launches of the two nondeterministic backends in this process


@backend(contract=CONTRACT, name="broken-segfaults")
def segfaults(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Dies of SIGSEGV, as a kernel wrapper dereferencing a bad host pointer does."""
    os.kill(os.getpid(), signal.SIGSEGV)


@backend(contract=CONTRACT, name="broken-aborts")
def aborts(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Dies of SIGABRT, as a failed C++ assertion (TORCH_CHECK in a noexcept path) does."""
    os.abort()


LAST_WORDS = "planted: the kernel's last words"


@backend(contract=CONTRACT, name="broken-prints-then-aborts")
def prints_then_aborts(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Prints why to stdout (as a library's error path does), then dies of SIGABRT: CRASH, its words quoted."""
    print(LAST_WORDS)
    os.abort()


@backend(contract=CONTRACT, name="broken-killed")
def killed(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Dies of SIGKILL, as a process the out-of-memory killer picks does: no handler runs, nothing is said."""
    os.kill(os.getpid(), signal.SIGKILL)


STARTED = "DIFFTEST_TEST_STARTED"  # the file a backend that starts then hangs writes once its call has begun


@backend(contract=CONTRACT, name="broken-starts-then-hangs")
def starts_then_hangs(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Writes the file $DIFFTEST_TEST_STARTED once its call has begun (what a test waits on before it signals
    the run), then never returns: the kernel a signal finds running."""
    with open(os.environ[STARTED], "a") as started:
        started.write(f"{os.getpid()}\n")
    time.sleep(HANG_SECONDS)


@backend(contract=CONTRACT, name="broken-hangs")
def hangs(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Never returns, like a kernel spinning on a barrier that some block never reaches."""
    time.sleep(HANG_SECONDS)


@backend(contract=CONTRACT, name="broken-segfaults-on-three")
def segfaults_on_three_requests(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Dies of SIGSEGV on a case of three requests, right on any other: a crash among calls queued to
    one worker."""
    if q.shape[0] == 3:
        os.kill(os.getpid(), signal.SIGSEGV)
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)


@backend(contract=CONTRACT, name="broken-segfaults-past-64")
def segfaults_past_64(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Dies of SIGSEGV where a row's window passes 64 keys (context_lens is per row), right otherwise: a
    crash that only some of a case's sequences cause, so shrinking it has somewhere to go."""
    if int(context_lens.max()) > 64:
        os.kill(os.getpid(), signal.SIGSEGV)
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)


@backend(contract=CONTRACT, name="broken-on-gpu-1")
def segfaults_on_gpu_1(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Right, but dies of SIGSEGV where CUDA_VISIBLE_DEVICES is '1', as on a GPU whose driver faults:
    a run spread over GPUs (--gpus) must lose only that GPU's shard."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "1":
        os.kill(os.getpid(), signal.SIGSEGV)
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)


@backend(contract=CONTRACT, name="hangs-on-gpu-1")
def hangs_on_gpu_1(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Right, but never returns where CUDA_VISIBLE_DEVICES is '1': shard 1 of a spread run is still
    running when the test interrupts or kills the run's parent."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "1":
        time.sleep(HANG_SECONDS)
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)


@backend(contract=CONTRACT, name="broken-raises")
def raises(q, kv_cache, weights, context_lens, block_table, max_model_len):
    raise RuntimeError("launch failed: too many resources requested")


def _launch_nested(weights):
    """A wrapper's helper, two calls below the backend: where the error is raised."""
    raise RuntimeError(f"nested launch failed for {weights.shape[0]} rows")  # NESTED_RAISE


@backend(contract=CONTRACT, name="broken-raises-nested")
def raises_nested(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Raises from a helper it calls: its traceback names _launch_nested and the line of its raise."""
    return _launch_nested(weights)


def nested_traceback_lines() -> list[str]:
    """Lines the traceback of raises_nested holds, wherever it was formatted: both frames, the file and line
    of the raise, the message."""
    lines, first = inspect.getsourcelines(_launch_nested)
    raise_line = first + next(i for i, line in enumerate(lines) if "# NESTED_RAISE" in line)
    return [f'File "{__file__}", line {raise_line}, in _launch_nested', ", in raises_nested",
            "RuntimeError: nested launch failed for "]


@backend(contract=CONTRACT, name="broken-writes-inputs")
def writes_into_inputs(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Right logits, but it scales the weights in place afterwards (an in-place op on a borrowed tensor)."""
    out = logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)
    weights.mul_(2.0)
    return out


@backend(contract=CONTRACT, name="broken-unwritten-row")
def leaves_row_unwritten(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Allocates its own output with torch.empty and never writes the last row (no block launched for it)."""
    out = torch.empty(weights.shape[0], max_model_len, dtype=torch.float32, device=q.device)
    full = logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)
    out[:-1] = full[:-1].to(out.dtype)
    return out


@backend(contract=CONTRACT, name="broken-reads-past-table")
def reads_past_table(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Off by one in the block loop: the last block of each sequence is read from the column after
    it, one past the used width. That column holds a stale entry, which the generators point at a
    NaN canary block, so the last block's positions come out NaN."""
    block_size = kv_cache.shape[1]
    seq_lens = context_lens.long()[:, -1]  # the last draft row sees the whole sequence
    used = (seq_lens + block_size - 1) // block_size  # (B,)
    columns = torch.arange(block_table.shape[1], device=block_table.device)
    last = (columns[None, :] == (used - 1)[:, None]) & (used[:, None] < block_table.shape[1])
    shifted = torch.where(last, block_table.roll(-1, dims=1), block_table)
    return logits_with_limits(q, kv_cache, weights, context_lens, shifted, max_model_len)


@backend(contract=CONTRACT, name="broken-nondeterministic")
def nondeterministic(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """A race: on every launch one row picks up a different error (an unsynchronised partial sum).

    The launch counter stands in for the scheduler's randomness, so two launches always differ
    (a random draw could repeat itself and make the test flaky).
    """
    launch = next(_LAUNCHES)
    out = logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)
    finite = torch.isfinite(out)
    rows = torch.nonzero(finite.any(dim=1)).flatten().tolist()
    if rows:
        row = rows[launch % len(rows)]
        out[row] = torch.where(finite[row], out[row] * (1 + 0.01 * launch) + 1e-3 * launch, out[row])
    return out


@backend(contract=CONTRACT, name="reorders-heads")
def reorders_heads(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Sums the heads in float32, forwards on one launch and backwards on the next (as a split-K
    reduction whose order follows the schedule): bits move, always within the fp32 rounding bound."""
    heads = list(range(q.shape[2]))
    total = None
    for h in heads if next(_LAUNCHES) % 2 else heads[::-1]:
        part = logits_with_limits(q[:, :, h:h + 1], kv_cache, weights[:, h:h + 1], context_lens, block_table,
                      max_model_len).float()
        total = part if total is None else torch.where(torch.isfinite(part), total + part, part)
    return total


def strict_raises() -> FunctionBackend:
    """A factory that renames `raises` and tightens its tolerance after making it: `raises`' own path
    builds something else, so a worker can rebuild it only from this factory's path."""
    made = FunctionBackend.from_function(raises)
    return dataclasses.replace(made, name="broken-raises-strict", contract=dataclasses.replace(made.contract, rtol=0.0))


# --------------------------------------------------------------------------- faults the runner must survive
# Each is ERROR, in-process as in a worker: none may take the run down.

SLOW_SECONDS = 0.25


@backend(contract=CONTRACT, name="broken-exits")
def exits(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Calls sys.exit, as a wrapper that 'handles' a bad launch by exiting does: ERROR, not the run's end."""
    raise SystemExit(3)


@backend(contract=CONTRACT, name="broken-interrupts")
def interrupts(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Raises KeyboardInterrupt of its own (no Ctrl-C was pressed): ERROR, the run goes on."""
    raise KeyboardInterrupt("raised by the backend")


@backend(contract=CONTRACT, name="broken-complex-output")
def complex_output(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """The right values, as complex64: ERROR(contract), though every real part is right."""
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len).to(torch.complex64)


@backend(contract=CONTRACT, name="broken-int-output")
def int_output(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """An int32 tensor of the right shape: ERROR(contract)."""
    return torch.zeros(weights.shape[0], max_model_len, dtype=torch.int32, device=q.device)


@backend(contract=CONTRACT, name="broken-wide-output")
def wide_output(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """One column too many: ERROR(contract)."""
    return torch.zeros(weights.shape[0], max_model_len + 1, dtype=torch.float32, device=q.device)


@backend(contract=CONTRACT, name="broken-meta-output")
def meta_output(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """An output on another device than its inputs (meta: the one other device every machine has)."""
    return torch.empty(weights.shape[0], max_model_len, dtype=torch.float32, device="meta")


@backend(contract=CONTRACT, name="slow")
def slow(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Right, after SLOW_SECONDS: a run long enough to interrupt."""
    time.sleep(SLOW_SECONDS)
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)


@dataclasses.dataclass
class _UnavailableRaises(FunctionBackend):
    def unavailable_reason(self, device: str) -> str | None:
        raise RuntimeError("driver query failed")


def unavailable_raises() -> FunctionBackend:
    """A backend whose unavailable_reason raises: ERROR on every case, not a crashed run nor silence."""
    made = FunctionBackend.from_function(raises)
    return _UnavailableRaises(name="broken-availability", contract=made.contract, fn=made.fn)
