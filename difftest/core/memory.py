"""The memory model, in one place: what a case, one backend's call on it and a batch of cases cost,
what may run side by side, and what counts as running out of memory.

The planner (difftest.generators.envelope: estimate_bytes, fit) sizes a spec's cases with `footprint`,
the runner's side-by-side rule (SideBySide, difftest.engine.runner) sizes a built case's calls with
`call_bytes`, and fuzz batching (difftest.workflows.fuzz) takes its caps from here, so a case is
counted the same way when it is planned, batched and run. Every figure is an upper bound in bytes,
derived below from the tensors the engine allocates; where a constant was measured, it says where.
What the devices have free is asked of difftest.core.hardware.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from difftest.core import hardware
from difftest.core.errors import message
from difftest.core.kinds import Device, Fp8Flavour

if TYPE_CHECKING:
    from difftest.core.case import Case
    from difftest.core.contract import Contract

# --------------------------------------------------------------------------- what a device can spare

SMALL_MEMORY = 2 << 30  # what a CI runner is assumed to spare when the host's free memory is unknown
MEMORY_HEADROOM = 0.85  # of the free memory a probe finds: allocator fragmentation, the CUDA context

# --------------------------------------------------------------------------- constants of the model

# The float64 torch oracle scores this many (sequence, row, head, position) elements at a time
# (restated: difftest.oracles.paged_mqa_logits._CHUNK_ELEMENTS; core may not import the oracles).
ORACLE_CHUNK_ELEMENTS = 1 << 22
# difftest.engine.comparison: float64 copies of both logits, ~8 boolean masks and three float64 temporaries
# (errors, row scales, top-k ranking) per logit, for COMPARE_CHUNK_ELEMENTS logits at a time
# (restated: difftest.engine.comparison.CHUNK_ELEMENTS).
COMPARE_BYTES_PER_LOGIT = 48
COMPARE_CHUNK_ELEMENTS = 1 << 25
# Case.validate's visible-slot check: a bool mask, the repeated int32 table, its int64 index and the
# float32 gathered scales over (B, W * block_size). 25 measured on the H200 (logits-over-2^31).
VALIDATE_BYTES_PER_SLOT = 26
# difftest.core.fp8.convert of a pool between flavours: float32 values, bytes, a float32 decode to check,
# and the int64 (block, slot, dim) indices of its boolean masks. 43 measured on the H200.
CONVERT_BYTES_PER_KEY = 44
# Small tensors round up to the allocator's blocks: tiny cases measured up to 2 MB over the sum of their parts.
BUILD_SLACK = 4 << 20
LOGIT_BYTES = 4  # a backend's output and the fused oracle's answer are fp32

# --------------------------------------------------------------------------- the side-by-side rule

# Workers' copies of one case's inputs, their outputs and the working memory their calls hold
# (call_bytes, or what a call was measured to allocate) may take this share of the device's free memory
# side by side: the rest is for the oracle, the comparison and what the kernels allocate undeclared.
SIDE_BY_SIDE_MEMORY = 0.2
# A call's peak allocation is measured (CUDA: max_memory_allocated around it) on launches of more logits
# than SMALL_LOGITS: below that, calls are small beside any GPU and the statistics reads would be most of
# a small call's cost (a fuzz campaign makes thousands a second).
MEASURED_FROM_LOGITS = 1 << 20

# --------------------------------------------------------------------------- fuzz batching

# A case is small enough to batch at this many logits (rows x max_model_len: B = 32 at next_n 4 and
# 8K); a batch holds at most BATCH_LOGITS logits (64 MiB of fp32 per output).
SMALL_LOGITS = 1 << 20
BATCH_LOGITS = 1 << 24
# The merged case is every member's rows by the widest member's max_model_len: each output, the oracle's
# and the comparisons are that shape. One wide small case (1 row of 2^20) among many rows of 8K would make
# it thousands of times a member's own logits (on the H200 two jobs ran out of memory asking for 5.8 GiB:
# on the H200): a batch closes before its merged shape passes BATCH_MERGED_LOGITS (256 MiB of
# fp32 per output). The small regime's widest batch (4096 rows of 8K) stays under it.
BATCH_MERGED_LOGITS = 1 << 26
# Small logits do not make a small case: the envelope's pool families (2^31-byte caches, block ids past
# 2^16) hold gigabytes of keys for a few rows. A case batches only with a pool of at most SMALL_POOL
# bytes, and a batch closes before its pools pass BATCH_POOL (merged, copied per worker: on the H200 a
# batch of such pools once asked for 36 GiB at a time).
SMALL_POOL = 64 << 20
BATCH_POOL = 1 << 30
# What each process of a fuzz job holds beyond what its cases need: a CUDA context (518 MiB on the H200,
# on the H200) and the free memory its allocator keeps (isolate.CACHE_KEPT_BYTES).
JOB_PROCESS_BYTES = 1 << 30
# Of several jobs, job 0 draws every large case and the others only small ones (at most SMALL_LOGITS and
# SMALL_POOL): side by side, large cases would share the GPU's memory and time (four jobs at production
# shapes ran no faster than one and ran out of memory on the H200). What a job of small cases
# holds at most: batches of at most BATCH_POOL of pools, PREFETCH_DEPTH + 2 of them drawn, a copy of one
# in each worker, and its outputs and comparisons.
SMALL_JOB_BYTES = 8 << 30


def is_small(logits: int, pool_bytes: int) -> bool:
    """Whether a case of `logits` logits (rows x max_model_len) and a pool of `pool_bytes` is small: it may
    batch, and any fuzz job may draw it."""
    return logits <= SMALL_LOGITS and pool_bytes <= SMALL_POOL


def jobs_reserve(jobs: int, processes_per_job: int) -> int:
    """Bytes fuzz job 0's plan leaves to the rest of `jobs` jobs side by side: SMALL_JOB_BYTES for each
    other job and JOB_PROCESS_BYTES for every process of every job (the job and its workers, on a GPU)."""
    return (jobs - 1) * SMALL_JOB_BYTES + jobs * processes_per_job * JOB_PROCESS_BYTES


# --------------------------------------------------------------------------- sizes

class Shape(NamedTuple):
    """What a case's memory depends on, as plain numbers: a built case's own (of_case) or a spec's upper
    bounds (difftest.generators.envelope.estimate_bytes, drawn lengths counted at their longest)."""

    batch: int  # requests, padding ones included
    next_n: int
    heads: int
    head_dim: int
    block_size: int
    max_model_len: int
    width: int  # block-table columns
    blocks: int  # pool blocks
    drawn_blocks: int  # blocks whose keys are drawn (the others hold canaries, one fill)
    longest: int  # the longest request, in tokens
    key_reads: int  # (row, key) pairs a kernel scores: the sum of the row limits
    fp8: Fp8Flavour = Fp8Flavour.E4M3FN
    heavy_values: bool = False  # heavy-tailed values are drawn in two passes

    @classmethod
    def of_case(cls, case: Case) -> Shape:
        """The shape of a built case (its lengths read once: Case.lengths)."""
        lengths = case.lengths
        reads = sum(max(n - case.next_n + j + 1, 0) for n in lengths for j in range(case.next_n))
        blocks = case.k_pool.shape[0]
        return cls(case.batch, case.next_n, case.heads, case.head_dim, case.block_size, case.max_model_len,
                   case.block_table.shape[1], blocks, blocks, max(lengths, default=0), reads, case.fp8)

    @property
    def rows(self) -> int:
        return self.batch * self.next_n

    @property
    def logits(self) -> int:
        """rows * max_model_len: the elements of one output."""
        return self.rows * self.max_model_len

    @property
    def key_bytes(self) -> int:
        """The fp8 keys of the pool alone."""
        return self.blocks * self.block_size * self.head_dim

    @property
    def pool_bytes(self) -> int:
        """Keys and fp32 scales: num_blocks * block_size * (D + 4)."""
        return self.blocks * self.block_size * (self.head_dim + 4)

    @property
    def other_bytes(self) -> int:
        """fp8 q and fp32 weights (D + 4 bytes per row and head), the int32 table, the int64 lengths."""
        return self.rows * self.heads * (self.head_dim + 4) + self.batch * self.width * 4 + self.batch * 8

    @property
    def slots(self) -> int:
        """batch * width * block_size: a re-paged case's token table has one entry per slot."""
        return self.batch * self.width * self.block_size


class CallBytes(NamedTuple):
    """What one backend call holds besides the case itself."""

    kernel: int  # the inputs the engine hands it: a packed copy of the pool, re-paged or converted
    logits: int  # its fp32 output
    working: int  # what its call allocates besides the logits (declared: Contract.working_memory)

    @property
    def total(self) -> int:
        return self.kernel + self.logits + self.working

    def describe(self) -> str:
        """'0.5 GB inputs + 8.6 GB logits + 0 B working memory (declared)'."""
        return (f"{size_text(self.kernel)} inputs + {size_text(self.logits)} logits + {size_text(self.working)} "
                "working memory (declared)")


def call_bytes(shape: Shape, contract: Contract | None) -> CallBytes:
    """The memory of one call of a backend with `contract` (None: no backend's extras) on a case of `shape`.

    The engine hands every backend its own packed copy of the pool and the small inputs (encode makes it,
    and a worker gets it copied or in a memory pool of its own); re-paged to block size 1 the table is
    an int64 entry per slot (8 bytes); converted to the contract's fp8 flavour, CONVERT_BYTES_PER_KEY
    per key byte at the peak. The output is fp32 logits; the call's own working memory is what the
    contract declares, linear in the logits."""
    kernel = shape.pool_bytes + shape.other_bytes
    logits = shape.logits * LOGIT_BYTES
    if contract is None:
        return CallBytes(kernel, logits, 0)
    if contract.block_size_for(shape.block_size) != shape.block_size:
        kernel += shape.slots * 8
    if contract.fp8 != shape.fp8:
        kernel += shape.key_bytes * CONVERT_BYTES_PER_KEY
    return CallBytes(kernel, logits, contract.working_memory.bytes_for(shape.logits, shape.heads))


def fused_oracle_bytes(shape: Shape) -> int:
    """The fused fp32 GPU oracle (difftest.oracles.fused): its logits and one fp32 bound per row."""
    return shape.logits * LOGIT_BYTES + shape.rows * 4


def torch_oracle_bytes(shape: Shape) -> int:
    """The float64 torch oracle (difftest.oracles.paged_mqa_logits): its output, the pool and q decoded
    whole (reference's k_values/q_values), and one chunk of sequences' scores (twice: einsum's temporary)
    and keys (fp8, float64 and a scale per key)."""
    visible = max(shape.longest, 1)
    per_sequence = shape.next_n * shape.heads * visible
    chunk = min(shape.batch, max(1, ORACLE_CHUNK_ELEMENTS // per_sequence))
    scores = chunk * per_sequence * 8 * 2
    keys = chunk * visible * (shape.head_dim * 9 + 8)
    decoded = shape.key_bytes * 8 + shape.rows * shape.heads * shape.head_dim * 8
    return shape.logits * 8 + decoded + scores + keys


def oracle_bytes(shape: Shape, device: Device) -> int:
    """The oracle used on `device`: fused fp32 on a GPU, float64 torch on the CPU."""
    return fused_oracle_bytes(shape) if device == Device.CUDA else torch_oracle_bytes(shape)


def compare_bytes(shape: Shape) -> int:
    """Judging one backend's output: COMPARE_BYTES_PER_LOGIT per logit, a chunk of logits at a time."""
    return min(shape.logits, COMPARE_CHUNK_ELEMENTS) * COMPARE_BYTES_PER_LOGIT


def build_bytes(shape: Shape) -> int:
    """The largest transient of drawing a case (build_case) and Case.validate: drawing keys or queries
    (float32 normals, clamped: 8 bytes per value; heavy values twice that), converting the pool to
    e4m3fnuz, the table's masks (18 bytes per entry), or the per-slot check of validate."""
    per_value = 16 if shape.heavy_values else 8
    draw = shape.drawn_blocks * shape.block_size * (shape.head_dim * per_value + 8)
    queries = shape.rows * shape.heads * (shape.head_dim + 2) * per_value
    convert = shape.key_bytes * CONVERT_BYTES_PER_KEY if shape.fp8 != Fp8Flavour.E4M3FN else 0
    table = shape.batch * shape.width * 18
    return max(draw, queries, convert, table, shape.slots * VALIDATE_BYTES_PER_SLOT) + BUILD_SLACK


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Bytes a case costs, as upper bounds (drawn lengths counted at their longest)."""

    pool_bytes: int  # num_blocks * block_size * (D + 4): keys and fp32 scales
    other_bytes: int  # q, weights, block table, lengths
    logits_bytes: int  # a backend's fp32 output: rows * max_model_len * 4
    oracle_fused_bytes: int  # the fused fp32 GPU oracle: its logits and per-row bounds
    oracle_cpu_bytes: int  # the float64 torch oracle: its logits, decoded pool and one chunk's scores
    compare_bytes: int  # judging one backend: COMPARE_BYTES_PER_LOGIT per logit
    kernel_bytes: int  # what the engine hands a kernel: a packed copy of the pool, re-paged or converted
    working_bytes: int  # what the backend's call allocates besides its logits (Contract.working_memory)
    build_bytes: int  # the peak build_case and Case.validate add while the case is made
    key_reads: int  # (row, key) pairs a kernel scores: the sum of the row limits

    @property
    def case_bytes(self) -> int:
        """The case's own tensors."""
        return self.pool_bytes + self.other_bytes

    def oracle_bytes(self, device: Device) -> int:
        """The oracle used on `device`: fused fp32 on a GPU, float64 torch on the CPU."""
        return self.oracle_fused_bytes if device == Device.CUDA else self.oracle_cpu_bytes

    def total(self, device: Device) -> int:
        """Peak bytes on `device`: the case, then the larger of making it and running one backend on it
        (its inputs, its logits and its own working memory, beside the oracle's answer and the comparison)."""
        running = (self.kernel_bytes + self.logits_bytes + self.working_bytes + self.oracle_bytes(device)
                   + self.compare_bytes)
        return self.case_bytes + max(self.build_bytes, running)

    def describe(self, device: Device) -> str:
        """'2.1 GB pool + 8.6 GB logits + ...': the parts of total(device)."""
        parts = [(self.pool_bytes, "pool"), (self.other_bytes, "q/weights/table"), (self.logits_bytes, "logits"),
                 (self.oracle_bytes(device), "oracle"), (self.compare_bytes, "compare"),
                 (self.kernel_bytes, "kernel inputs"), (self.working_bytes, "kernel working memory")]
        shown = " + ".join(f"{size_text(n)} {what}" for n, what in parts if n >= 1 << 20) or "under 1 MB in all"
        return f"{shown}; building peaks at {size_text(self.case_bytes + self.build_bytes)}"


def footprint(shape: Shape, contract: Contract | None = None) -> Footprint:
    """What a case of `shape` costs, and what running a backend of `contract` adds when it is given."""
    call = call_bytes(shape, contract)
    return Footprint(pool_bytes=shape.pool_bytes, other_bytes=shape.other_bytes, logits_bytes=call.logits,
                     oracle_fused_bytes=fused_oracle_bytes(shape), oracle_cpu_bytes=torch_oracle_bytes(shape),
                     compare_bytes=compare_bytes(shape), kernel_bytes=call.kernel, working_bytes=call.working,
                     build_bytes=build_bytes(shape), key_reads=shape.key_reads)


# --------------------------------------------------------------------------- what may run side by side

@dataclasses.dataclass
class SideBySide:
    """The rule deciding whether a case's calls run side by side, and what it has learned in one run.

    A call counts as its call_bytes, or, once a call of its backend was measured (Execution.peak_bytes:
    what it allocated beyond what it was handed), as its inputs plus that many bytes per logit when that
    is more. Calls run side by side while together they take at most SIDE_BY_SIDE_MEMORY of the device's
    free memory, and stop doing so for cases as large as one on which a call ran out of memory beside
    others (ran_out): such a call is tried again alone, and every later case of that size runs its calls
    one at a time without trying."""

    alone_from: int | None = None  # calls together at least this large run one at a time (learned)
    per_logit: dict[str, float] = dataclasses.field(default_factory=dict)  # backend -> measured bytes per logit

    def counted(self, backend: str, shape: Shape, contract: Contract | None) -> int:
        """The bytes one call of `backend` on a case of `shape` is counted at."""
        call = call_bytes(shape, contract)
        measured = int(self.per_logit.get(backend, 0.0) * shape.logits)
        return call.kernel + max(call.logits + call.working, measured)

    def together(self, counted: Iterable[int], free: int | None) -> bool:
        """Whether calls of these counted bytes run side by side, with `free` bytes free on the device
        (None: not known, and nothing learned against it)."""
        total = sum(counted)
        if self.alone_from is not None and total >= self.alone_from:
            return False
        return free is None or total <= SIDE_BY_SIDE_MEMORY * free

    def ran_out(self, together: int) -> None:
        """A call ran out of memory beside others while they were counted at `together` bytes."""
        self.alone_from = together if self.alone_from is None else min(self.alone_from, together)

    def measured(self, backend: str, peak_bytes: int, logits: int) -> None:
        """A call of `backend` on `logits` logits allocated `peak_bytes` at its peak."""
        if logits > 0:
            self.per_logit[backend] = max(self.per_logit.get(backend, 0.0), peak_bytes / logits)


# --------------------------------------------------------------------------- running out

# What an out-of-memory error says, wherever it comes from: torch's allocators (CUDA: "CUDA out of memory";
# CPU: "DefaultCPUAllocator: can't allocate memory"), CUDA and HIP error names and strings a kernel library
# passes on, cuBLAS's workspace allocation, and numpy's MemoryError.
_OUT_OF_MEMORY_TYPES = frozenset({"OutOfMemoryError", "MemoryError", "_ArrayMemoryError"})
_OUT_OF_MEMORY_TEXT = re.compile(r"out of memory|can't allocate memory|cannot allocate memory|ERROR_OUT_OF_MEMORY|"
                                 r"ErrorMemoryAllocation|hipErrorOutOfMemory|CUBLAS_STATUS_ALLOC_FAILED",
                                 re.IGNORECASE)


def is_out_of_memory(error_type: str | None, text: str | None) -> bool:
    """Whether an error of this class name and message is a device or host running out of memory."""
    return error_type in _OUT_OF_MEMORY_TYPES or bool(text and _OUT_OF_MEMORY_TEXT.search(text))


def ran_out(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed for want of memory."""
    return is_out_of_memory(type(exc).__name__, message(exc))  # message: a backend's __str__ may raise


def usable(device: Device) -> int:
    """What the planner may count on for one case on `device`: its free memory (host_memory on the CPU)
    times MEMORY_HEADROOM, or SMALL_MEMORY where the host does not say."""
    free = hardware.available_memory(device.value)
    return SMALL_MEMORY if free is None else int(free * MEMORY_HEADROOM)


def size_text(n: int) -> str:
    """Bytes in decimal units, one decimal: '2.1 GB'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
