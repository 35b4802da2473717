"""The enums every layer shares, in a module that imports nothing heavy (the CLI parses with them).

Encodings and layouts are described in docs/reference/encodings.md and docs/reference/layouts.md.
"""

from __future__ import annotations

import enum
from typing import Any


class LengthEncoding(str, enum.Enum):
    """How the causal limits reach the kernel (docs/reference/encodings.md)."""

    PER_ROW = "per-row"  # (B, next_n): len[b, j] = max(L_b - next_n + j + 1, 0)
    PER_SEQUENCE = "per-sequence"  # (B,): L_b; the kernel derives each row's limit itself
    FLATTENED = "flattened"  # (B * next_n,) rows of next_n = 1, block-table rows repeated
    FLATTENED_INDICES = "flattened-indices"  # (T,) limits plus (T,) request id of each row
    PREFIX_SUM = "prefix-sum"  # (B + 1,) prefix sums of L_b over flat token indices (ragged)


class CacheLayout(str, enum.Enum):
    """Byte layout of the uint8 [num_blocks, block_size, 1, D + 4] cache (docs/reference/layouts.md)."""

    BLOCK_SPLIT = "block-split"  # per block: block_size * D key bytes, then block_size fp32 scales
    TOKEN_INTERLEAVED = "token-interleaved"  # per token: D key bytes, then its 4 scale bytes


class MaskConvention(str, enum.Enum):
    """What a backend promises about positions at or past a row's limit (docs/reference/masks.md)."""

    TAIL_NEG_INF = "tail-neg-inf"  # every position past the limit is -inf
    TAIL_UNSPECIFIED = "tail-unspecified"  # past the limit anything may be written (not cleaned)


class Fp8Flavour(str, enum.Enum):
    """Which e4m3 encoding a byte is in. e4m3fnuz's exponent bias is one higher: half the value."""

    E4M3FN = "e4m3fn"
    E4M3FNUZ = "e4m3fnuz"

    @property
    def dtype(self) -> Any:
        """The torch dtype of this flavour."""
        import torch  # deferred: this module stays importable without torch

        return {Fp8Flavour.E4M3FN: torch.float8_e4m3fn, Fp8Flavour.E4M3FNUZ: torch.float8_e4m3fnuz}[self]

    @property
    def nan_byte(self) -> int:
        """A byte that decodes to NaN: the canary written into blocks nobody should read."""
        return {Fp8Flavour.E4M3FN: 0x7F, Fp8Flavour.E4M3FNUZ: 0x80}[self]


class PartitionScope(str, enum.Enum):
    """Over what a kernel spreads its units of work among workers (difftest.core.contract.WorkPartition)."""

    GLOBAL = "global"  # the units of every request laid end to end, cut into contiguous ranges per worker
    PER_ROW = "per-row"  # each query row's units cut among a fixed number of programs of its own


class Device(str, enum.Enum):
    """Where a run computes."""

    CPU = "cpu"
    CUDA = "cuda"


class SanitizerTool(str, enum.Enum):
    """The compute-sanitizer tool a failing result is replayed under."""

    MEMCHECK = "memcheck"
    RACECHECK = "racecheck"
    INITCHECK = "initcheck"
    SYNCCHECK = "synccheck"


class Transport(str, enum.Enum):
    """How tensors reach a worker process."""

    COPY = "copy"  # CPU copies through the pipe
    CUDA_IPC = "cuda-ipc"  # CUDA memory handles: no bytes go through the pipe


class Isolation(str, enum.Enum):
    """Where a backend's call ran."""

    WORKER = "worker"  # a worker process of its own
    IN_PROCESS = "in-process"  # the run's own process (the result's isolation note says why, when isolation was asked)


class OperationKind(str, enum.Enum):
    """Which stage of the indexer a run tests (difftest.core.operation.Operation; docs/writing-an-operation.md)."""

    PAGED_LOGITS = "paged-logits"  # decode: paged MQA logits (the engine's first operation)
    RAGGED_LOGITS = "ragged-logits"  # prefill: MQA logits over each query's key window
    TOPK = "topk"  # the k largest logits of each row's window, as indices
    INDEXER = "indexer"  # a logits kernel followed by a top-k kernel: the token set the sparse attention reads
    PREFILL_INDEXER = "prefill-indexer"  # the indexer of a prefill step: ragged logits, then top-k per row window


class Headline(str, enum.Enum):
    """A number a report leads with for an operation."""

    MASK = "mask"  # rows whose -inf mask is wrong
    SELECTION = "selection"  # rows whose selected token set is wrong, and by how many tokens


class CaseKind(str, enum.Enum):
    """Which cases a suite draws."""

    ENVELOPE = "envelope"  # each backend's declared envelope, at the device's scale (engine.plan.envelope_plan)
    RANDOM = "random"  # the fixed toy-shape random specs
    EDGES = "edges"  # the fixed toy-shape edge list
    ALL = "all"  # random and edges


class CiSystem(str, enum.Enum):
    """The CI systems `difftest matrix emit` writes configuration for (difftest.matrix.emit)."""

    GITHUB = "github"  # a GitHub Actions workflow
    BUILDKITE = "buildkite"  # a Buildkite pipeline


class OracleKind(str, enum.Enum):
    """Which oracle a run compares against."""

    EXACT = "exact"  # the float64 torch oracle: the truth, to float64 rounding
    FAST = "fast"  # the fused Triton oracle: fp32 sums of exact products, with a rigorous per-row bound
    # No oracle: masks judged against the true windows, values against the other backends (consensus), a
    # disagreement settled by the metamorphic relations (difftest.engine.consensus)
    NONE = "none"


class MetamorphicRelation(str, enum.Enum):
    """A metamorphic relation: a change of a case whose logits follow from the original's without an oracle
    (difftest.engine.metamorphic)."""

    PERMUTE_PAGES = "permute-pages"  # physical blocks renumbered, the table remapped: the same logits
    REORDER_REQUESTS = "reorder-requests"  # requests shuffled: their rows move with them
    PAD_REQUESTS = "pad-requests"  # an empty request before every request and after the last: rows unchanged
    SPLIT_BATCH = "split-batch"  # the requests in two launches: their rows concatenated
    FLATTEN_NEXT_N = "flatten-next-n"  # every draft row a request of next_n 1 (the flattened encoding)
    SCALE_Q = "scale-q"  # q (or the weights) times 2: every logit times 2, exactly
    PERMUTE_HEADS = "permute-heads"  # heads shuffled with their weights: the same head sum
    APPEND_KEYS = "append-keys"  # every slot no window covers given finite keys: windows unchanged


class TopkRelation(str, enum.Enum):
    """A metamorphic relation of the top-k operation: a change of a case whose answer follows from the
    original's without an oracle (difftest.engine.topk_metamorphic)."""

    ADD_NEG_INF = "add-neg-inf"  # -inf entries inserted at the end of every window: the same candidates chosen
    PERMUTE_COLUMNS = "permute-columns"  # each window's columns shuffled: the same values chosen


class RaggedRelation(str, enum.Enum):
    """A metamorphic relation of the ragged (prefill) logits operation: a change of a case whose logits follow
    from the original's without an oracle (difftest.engine.ragged_metamorphic). Three share a paged relation's
    name and idea; which operation's a name is comes from the run (or the bundle) it is named in."""

    SHIFT_KEYS = "shift-keys"  # 3 keys inserted before the buffer: every window 3 keys to the right
    PERMUTE_ROWS = "permute-rows"  # rows shuffled with their q, weights and windows: their logits move with them
    SCALE_Q = "scale-q"  # q (or the weights) times 2: every logit times 2
    PERMUTE_HEADS = "permute-heads"  # heads shuffled with their weights: the same head sum
    APPEND_KEYS = "append-keys"  # keys no window reaches appended after the buffer: windows unchanged
    SPLIT_ROWS = "split-rows"  # the first half of the rows and the second in two launches: their rows concatenated


AnyRelation = MetamorphicRelation | TopkRelation | RaggedRelation  # a relation of some operation's

# The metamorphic relations of each operation that has some: RunConfig.metamorphic holds one operation's, the
# CLI's --metamorphic names them, a bundle records them. Paged logits checks its own in its own runner
# (difftest.engine.metamorphic); top-k and ragged logits through their Operation (difftest.engine.topk_metamorphic,
# difftest.engine.ragged_metamorphic).
RELATIONS: dict[OperationKind, type[MetamorphicRelation] | type[TopkRelation] | type[RaggedRelation]] = {
    OperationKind.PAGED_LOGITS: MetamorphicRelation, OperationKind.RAGGED_LOGITS: RaggedRelation,
    OperationKind.TOPK: TopkRelation}


class TimingMethod(str, enum.Enum):
    """How a backend's launches were timed (`difftest run --time K`, difftest.engine.timing)."""

    CUDA_EVENTS = "cuda-events"  # a torch.cuda.Event pair around each launch, L2 flushed before it
    PERF_COUNTER = "perf-counter"  # time.perf_counter around each launch (the CPU)


class TimedRegion(str, enum.Enum):
    """What the timed launches covered."""

    KERNEL = "kernel"  # the per-layer call alone: per-batch schedule/metadata built once, outside (Backend.prepare)
    WHOLE_CALL = "whole-call"  # the backend declares no prepare(): the whole call, its per-batch set-up included


class ExitStatus(enum.IntEnum):
    """What `difftest` exits with (docs/cli.md lists them)."""

    OK = 0  # every result passed or was skipped
    FAILED = 1  # some backend failed (or a shard of a spread run died)
    USAGE = 2  # a bad option or an impossible spec: one line names the field, its value and what is allowed
    IO = 3  # an output (report, stream, bundle) could not be written, or another run holds it: one line says why
    INTERRUPTED = 130  # Ctrl-C: what finished is kept (stream, report marked incomplete); --resume continues


# --------------------------------------------------------------------------- the top-k operation

class IndexConvention(str, enum.Enum):
    """What a top-k kernel's index counts from (docs/reference/topk.md)."""

    ROW_RELATIVE = "row-relative"  # from the row's window start: 0 is the window's first column
    ABSOLUTE = "absolute"  # the column of the logits row


class TopkPadding(str, enum.Enum):
    """What a top-k kernel writes in the slots its window cannot fill (docs/reference/topk.md)."""

    # -1 in exactly k - min(k, candidates) slots: a -inf (or NaN-undefined) position is never returned.
    PAST_CANDIDATES = "past-candidates"
    # -1 in exactly k - min(k, window length) slots: -inf positions inside the window rank as the
    # lowest values and fill what the candidates leave (vLLM's and SGLang's kernels, FlashInfer).
    PAST_WINDOW = "past-window"
    # No -1: the slots the candidates leave hold distinct indices that are no candidate (columns outside the
    # window, -inf positions inside it, indices past the row's width); the caller masks them (FlagGems'
    # bucket_sort_topk, whose sparse-MLA consumer drops every index past the causal limit).
    OUTSIDE_COLUMNS = "outside-columns"


class NanRanking(str, enum.Enum):
    """How a top-k kernel ranks a NaN logit."""

    HIGHEST = "highest"  # above +inf, as torch.topk and the radix kernels' float-to-key maps rank it
    UNDEFINED = "undefined"  # nothing promised: a row holding NaN is judged on its indices' safety alone


class WindowForm(str, enum.Enum):
    """How a top-k kernel is told each row's window [start, end)."""

    STARTS_ENDS = "starts-ends"  # row_starts and row_ends, [rows] each
    STARTS_LENGTHS = "starts-lengths"  # row_starts and lengths (end = start + length)
    LENGTHS = "lengths"  # lengths alone: every window starts at column 0
    DECODE_RULE = "decode-rule"  # seq_lens [B] and next_n: row b*next_n + j ends at max(L_b - next_n + j + 1, 0)


class RowStride(str, enum.Enum):
    """What a top-k kernel requires of the logits' row stride (stride(1) is 1 for every kernel)."""

    ANY = "any"  # stride(0) >= width, read from the tensor or passed
    MULTIPLE_OF_4 = "multiple-of-4"  # 16-byte vectorised or TMA loads of fp32 rows
    EQUALS_WIDTH = "equals-width"  # contiguous rows: the kernel computes row r's base as r * width


# --------------------------------------------------------------------------- the ragged (prefill) logits operation

class LogitsForm(str, enum.Enum):
    """Which key each column of a ragged logits row holds (docs/reference/ragged.md)."""

    ABSOLUTE = "absolute"  # [rows, keys]: column p is key p
    # [rows, max_seqlen_k]: column j is key k_start + j (DeepGEMM 2.8's compressed logits)
    WINDOW_RELATIVE = "window-relative"
