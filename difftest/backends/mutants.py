"""Mutants: one correct Triton paged MQA logits kernel and a copy of it per bug class, for `difftest selftest`.

The kernel (difftest/backends/_mutant_kernel.py) reads what DeepGEMM reads (per-row limits [B, next_n],
block-split e4m3fn cache, fp32 output, -inf past each window) and runs on a GPU and, under the Triton
interpreter, on the CPU. Each mutant is the same kernel compiled with one `Mutation` switched on; each
declares the bug class it plants (docs/reference/bug-classes.md), the edge family that should catch it
(difftest.generators.envelope.EdgeFamily, or the fuzz round), and what the envelope must hold for any case to
reach it (`Requirement`: draft rows, two head groups, production scale...). Two must pass: the correct kernel,
and one that sums the heads in another order on every launch (bits move, always within tolerance).

A mutant takes the envelope of a template contract (a user's backend: heads, head dims, block sizes, next_n,
longest context, pool, tiles, work partition, mask convention, tolerance), so the planner draws the cases it
would draw for that backend, and a selftest's score is for that envelope. Its interface stays the kernel's.
A worker process rebuilds a mutant from `difftest.backends.mutants:<key>` (module __getattr__); the template
reaches it through the TEMPLATE_ENV environment variable, which the selftest sets while it runs.

The other operations' mutants are entries of the same catalogue, each run on its operation's plan: the top-k
ones (difftest.backends.topk_mutants: torch's top-k, its ties, padding and index convention) on the top-k plan
(difftest.generators.topk), the ragged (prefill) logits ones (difftest.backends.ragged_mutants: a tiled torch
kernel, its window starts and ends, q blocks, stores, heads, fp8 flavour and 32-bit offsets) on the ragged plan
(difftest.generators.ragged). Both keep their own contract: a template shapes the paged mutants only.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from difftest.backends.ragged_mutants import BLOCK_Q, RaggedMutant, RaggedMutation
from difftest.backends.ragged_mutants import HEAD_GROUP as RAGGED_HEAD_GROUP
from difftest.backends.ragged_mutants import TILE as RAGGED_TILE
from difftest.backends.registry import load_backend
from difftest.backends.topk_mutants import CANDIDATE_BUFFER, TopkMutation, TorchTopkMutant
from difftest.core import hardware
from difftest.core.contract import Contract
from difftest.core.errors import SpecError, require
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention, OperationKind
from difftest.core.triton_interpret import interpreter_compat, load_kernel_module
from difftest.generators.envelope import EdgeFamily
from difftest.generators.ragged import RaggedFamily
from difftest.generators.topk import TopkFamily

KERNEL_FILE = Path(__file__).with_name("_mutant_kernel.py")
TEMPLATE_ENV = "DIFFTEST_SELFTEST_TEMPLATE"  # 'package.module:object' or a registered name: the envelope's source
PREFIX = "mutant-"
TILE = 64  # key positions per tile when the template declares none that fits (DeepGEMM's compute block)
SPLITS = 3  # programs per row; 3 divides no power-of-two tile count, so ranges end unevenly
HEAD_GROUP = 16  # heads per tl.dot: its smallest M
HEAD_DIMS = (16, 32, 64, 128, 256)  # tl.arange takes powers of two


class Mutation(enum.IntEnum):
    """The kernel's MUTATION switch (the constants of _mutant_kernel.py, restated)."""

    NONE = 0
    MIRRORED_WINDOW = 1
    WINDOW_PAST_END = 2
    LENGTHS_PER_SEQUENCE = 3
    AFTER_EMPTY = 4
    SPLIT_FLOOR = 5
    PARTIAL_TILE_DROPPED = 6
    PARTIAL_TILE_OVER_READ = 7
    POOL_OFFSET_INT32 = 8
    ROW_OFFSET_INT32 = 9
    POSITION_OFFSET_INT32 = 10
    POSITIONS_INT16 = 11
    HEAD_GROUP_WEIGHTS = 12
    FP8_FNUZ = 13
    TOKEN_INTERLEAVED = 14
    STALE_COLUMN = 15
    STORE_PAST_ROW = 16
    ROTATED_HEAD_SUM = 17


class BugClass(str, enum.Enum):
    """The classes of docs/reference/bug-classes.md a mutant plants (its section numbers)."""

    NONE = "none (correct)"
    WINDOW = "3-4 window limit per draft row"
    LENGTH_ENCODING = "1 lengths read per sequence"
    EMPTY_REQUEST = "5 the row after an empty request"
    TILES = "4 split and tile multiples"
    OFFSETS_32 = "8 32-bit offsets"
    POSITIONS_16 = "8 16-bit positions"
    HEAD_GROUPS = "6 head-group weights"
    FP8_FLAVOUR = "6 fp8 flavour"
    LAYOUT = "6 scale layout"
    STALE_TABLE = "7 stale table entries"
    STORES = "10 stores past a row or the buffer"
    OFF_BY_ONE = "4 off by one at the window end"
    EMPTY_WINDOW = "5 empty windows"
    WINDOW_START = "ragged window start misplaced"
    Q_BLOCKS = "ragged q blocks"
    TOPK_TIES = "top-k ties at the k-th value"
    TOPK_PADDING = "top-k padding"
    TOPK_INDICES = "top-k indices row-relative or absolute"
    NONDETERMINISM = "11 nondeterminism within tolerance"


class Requirement(str, enum.Enum):
    """What the envelope must hold for some case to reach a mutant's bug."""

    DRAFT_ROWS = "draft rows (next_n >= 2)"
    HEAD_GROUPS = f"more than {HEAD_GROUP} heads (a second head group)"
    BLOCKS = "a block size above 1 (at block size 1 both layouts are the same bytes)"
    TAIL_JUDGED = "the tail judged (mask tail-neg-inf)"
    PRODUCTION = "production scale (a GPU run)"


FUZZ = "fuzz"  # what `caught_by` says for a mutant left to the fuzz round


@dataclasses.dataclass(frozen=True)
class MutantSpec:
    """One mutant: its switch, the bug class it plants, the family that should catch it (or FUZZ), what the
    envelope must hold for that, and whether a correct selftest must see it pass."""

    key: str  # its attribute here (difftest.backends.mutants:<key>) and, dashed, its name
    mutation: Mutation | TopkMutation | RaggedMutation  # the paged kernel's switch, or the top-k or ragged mutant's
    bug_class: BugClass
    caught_by: EdgeFamily | TopkFamily | RaggedFamily | str  # the family whose cases should fail, or FUZZ
    needs: tuple[Requirement, ...] = ()
    summary: str = ""
    must_pass: bool = False  # the correct kernels and the nondeterministic ones

    @property
    def operation(self) -> OperationKind:
        """The operation it is a kernel of: its cases are that operation's plan."""
        return _OPERATION_OF[type(self.mutation)]

    @property
    def name(self) -> str:
        """The backend's name in results: 'mutant-' and the key, dashed."""
        return PREFIX + self.key.replace("_", "-")

    @property
    def production_only(self) -> bool:
        """Whether only production-scale cases reach it (past 2^31 bytes, 2^15 positions)."""
        return Requirement.PRODUCTION in self.needs


_OPERATION_OF = {Mutation: OperationKind.PAGED_LOGITS, TopkMutation: OperationKind.TOPK,
                 RaggedMutation: OperationKind.RAGGED_LOGITS}
_DRAFT, _HEADS, _BLOCKS, _TAIL, _PROD = (Requirement.DRAFT_ROWS, Requirement.HEAD_GROUPS, Requirement.BLOCKS,
                                         Requirement.TAIL_JUDGED, Requirement.PRODUCTION)
_F, _R = EdgeFamily, RaggedFamily
CATALOGUE: tuple[MutantSpec, ...] = (
    MutantSpec("correct", Mutation.NONE, BugClass.NONE, _F.RANDOM, must_pass=True,
               summary="the kernel as written: every case must pass"),
    MutantSpec("rotated_head_sum", Mutation.ROTATED_HEAD_SUM, BugClass.NONDETERMINISM, _F.RANDOM, must_pass=True,
               summary="each launch sums the heads from another starting head: bits move, within tolerance"),
    MutantSpec("mirrored_window", Mutation.MIRRORED_WINDOW, BugClass.WINDOW, _F.NEXT_N, (_DRAFT,),
               "draft row j takes row next_n - 1 - j's limit (the window mirrored)"),
    MutantSpec("window_past_end", Mutation.WINDOW_PAST_END, BugClass.WINDOW, _F.SHORT_LENGTHS, (_TAIL,),
               "every row sees one key past its limit (off by one)"),
    MutantSpec("lengths_per_sequence", Mutation.LENGTHS_PER_SEQUENCE, BugClass.LENGTH_ENCODING, _F.NEXT_N, (_DRAFT,),
               "the [B, next_n] limits read as one length per sequence (vllm#59420)"),
    MutantSpec("after_empty", Mutation.AFTER_EMPTY, BugClass.EMPTY_REQUEST, _F.SHORT_LENGTHS,
               summary="a request after an empty one is scored with the empty one's q and weights (DeepGEMM 2.8.1)"),
    MutantSpec("split_floor", Mutation.SPLIT_FLOOR, BugClass.TILES, _F.RANDOM,
               summary="tiles per split rounded down: a row's last tiles are never written"),
    MutantSpec("partial_tile_dropped", Mutation.PARTIAL_TILE_DROPPED, BugClass.TILES, _F.TILE_MULTIPLES,
               summary="a tile the window ends inside is left -inf"),
    MutantSpec("partial_tile_over_read", Mutation.PARTIAL_TILE_OVER_READ, BugClass.TILES, _F.TILE_MULTIPLES,
               (_TAIL,), "a tile the window ends inside is scored to its end, past the window"),
    MutantSpec("pool_offset_int32", Mutation.POOL_OFFSET_INT32, BugClass.OFFSETS_32, _F.POOL_2_31_BYTES, (_PROD,),
               "block id * bytes per block in int32: wraps in a cache past 2^31 bytes"),
    MutantSpec("row_offset_int32", Mutation.ROW_OFFSET_INT32, BugClass.OFFSETS_32, _F.LOGITS_2_31_ELEMENTS, (_PROD,),
               "row * max_model_len in int32: wraps past 2^31 logits"),
    MutantSpec("position_offset_int32", Mutation.POSITION_OFFSET_INT32, BugClass.OFFSETS_32, _F.LOGITS_2_31_ELEMENTS,
               (_PROD,), "row * max_model_len + position, all in int32: wraps past 2^31 logits"),
    MutantSpec("positions_int16", Mutation.POSITIONS_INT16, BugClass.POSITIONS_16, _F.POSITIONS_2_15, (_PROD,),
               "key positions held in int16: position 2^15 wraps negative"),
    MutantSpec("head_group_weights", Mutation.HEAD_GROUP_WEIGHTS, BugClass.HEAD_GROUPS, _F.RANDOM, (_HEADS,),
               "every group of 16 heads weighted with the first group's weights"),
    MutantSpec("fp8_fnuz", Mutation.FP8_FNUZ, BugClass.FP8_FLAVOUR, _F.RANDOM,
               summary="e4m3fn bytes decoded as e4m3fnuz (half the value)"),
    MutantSpec("token_interleaved", Mutation.TOKEN_INTERLEAVED, BugClass.LAYOUT, _F.RANDOM, (_BLOCKS,),
               "the block-split cache read as token-interleaved"),
    MutantSpec("stale_column", Mutation.STALE_COLUMN, BugClass.STALE_TABLE, _F.STALE_TABLES,
               summary="each sequence's last block read from the table column after it (a stale entry)"),
    MutantSpec("store_past_row", Mutation.STORE_PAST_ROW, BugClass.STORES, _F.RANDOM,
               summary="a split's tiles not clamped to the row: stored in full over the next row's first "
                       "positions (and past the buffer)"),
    MutantSpec("ragged_correct", RaggedMutation.NONE, BugClass.NONE, _R.RANDOM, must_pass=True,
               summary="the ragged kernel as written: every case must pass"),
    MutantSpec("ragged_rotated_head_sum", RaggedMutation.ROTATED_HEAD_SUM, BugClass.NONDETERMINISM, _R.RANDOM,
               must_pass=True, summary="each launch sums the heads from another starting head: bits move, within "
                                       "tolerance"),
    MutantSpec("ragged_tiles_from_key_0", RaggedMutation.TILES_FROM_KEY_0, BugClass.WINDOW_START, _R.TILE_ENDS,
               summary=f"whole tiles run from k_start while below k_end rounded down to {RAGGED_TILE} from key 0, the "
                       "tail masked from there: a window starting off a tile is shifted (AITER 0.1.7.post2.dev18); "
                       "tile-ends holds the same lengths from key 0 and key 3"),
    MutantSpec("ragged_start_aligned", RaggedMutation.START_ALIGNED, BugClass.WINDOW_START, _R.KS_UNALIGNED,
               summary="k_start rounded down to a multiple of 4 (a kernel that assumes DeepGEMM's aligned starts)"),
    MutantSpec("ragged_end_inclusive", RaggedMutation.END_INCLUSIVE, BugClass.OFF_BY_ONE, _R.RANDOM,
               summary="k_end read as the window's last key: one key past every window"),
    MutantSpec("ragged_block_first_window", RaggedMutation.BLOCK_FIRST_WINDOW, BugClass.Q_BLOCKS,
               _R.DISJOINT_BLOCKS, summary=f"every row of a q block of {BLOCK_Q} scored over the block's first "
                                           "row's window"),
    MutantSpec("ragged_partial_block_dropped", RaggedMutation.PARTIAL_BLOCK_DROPPED, BugClass.Q_BLOCKS,
               _R.ROW_COUNTS, summary=f"the rows past the last whole q block of {BLOCK_Q} never scored (left -inf)"),
    MutantSpec("ragged_empty_window_key", RaggedMutation.EMPTY_WINDOW_KEY, BugClass.EMPTY_WINDOW, _R.EMPTY_WINDOWS,
               summary="an empty window (k_start == k_end) still scores its first key"),
    MutantSpec("ragged_buffer_end_unmasked", RaggedMutation.BUFFER_END_UNMASKED, BugClass.STORES, _R.BUFFER_END,
               summary="a window reaching the key buffer's end stores its last tile whole: keys read past the "
                       "buffer (NaN) land on the next row"),
    MutantSpec("ragged_max_seqlen_k_floor", RaggedMutation.SEQLEN_FLOOR, BugClass.TILES, _R.MAX_SEQLEN_K,
               summary=f"tiles per row bounded by max_seqlen_k (the longest window) // {RAGGED_TILE}: the tail of "
                       "a window longer than that is left -inf"),
    MutantSpec("ragged_head_group_weights", RaggedMutation.HEAD_GROUP_WEIGHTS, BugClass.HEAD_GROUPS, _R.HEADS,
               summary=f"heads past the first {RAGGED_HEAD_GROUP} weighted with the first {RAGGED_HEAD_GROUP}'s "
                       f"weights: only a case of more than {RAGGED_HEAD_GROUP} heads (the plan's base has 32 on "
                       "the CPU) shows it"),
    MutantSpec("ragged_fp8_fnuz", RaggedMutation.FP8_FNUZ, BugClass.FP8_FLAVOUR, _R.RANDOM,
               summary="e4m3fn key bytes decoded as e4m3fnuz (half the value)"),
    MutantSpec("ragged_key_offset_int32", RaggedMutation.KEY_OFFSET_INT32, BugClass.OFFSETS_32, _R.KEYS_2_31_BYTES,
               (_PROD,), "key index * D in int32: keys past 2^31 bytes read from a wrapped (negative) offset"),
    MutantSpec("ragged_row_offset_int32", RaggedMutation.ROW_OFFSET_INT32, BugClass.OFFSETS_32,
               _R.LOGITS_2_31_ELEMENTS, (_PROD,), "row * keys in int32: rows past 2^31 logits stored at a wrapped "
                                                  "(negative) offset, never written"),
    MutantSpec("topk_correct", TopkMutation.NONE, BugClass.NONE, TopkFamily.RANDOM, must_pass=True,
               summary="torch's top-k as SGLang's reference path calls it: every case must pass"),
    MutantSpec("topk_random_ties", TopkMutation.RANDOM_TIES, BugClass.NONDETERMINISM, TopkFamily.TIES_STRADDLE,
               must_pass=True, summary="another choice among values tied with the k-th on every launch: right"),
    MutantSpec("topk_candidate_buffer", TopkMutation.CANDIDATE_BUFFER, BugClass.TOPK_TIES, TopkFamily.TIES_PAST_2048,
               summary=f"values at or above the k-th past the first {CANDIDATE_BUFFER} in column order lost "
                       "(a capped candidate buffer, sglang#35257)"),
    MutantSpec("topk_padded_past_window", TopkMutation.PADDED_PAST_WINDOW, BugClass.TOPK_PADDING,
               TopkFamily.FEW_CANDIDATES, summary="-1 only past the window length, -inf positions inside it returned "
                                                  "(vLLM's convention) where -1 past the candidates is promised"),
    MutantSpec("topk_absolute_indices", TopkMutation.ABSOLUTE_INDICES, BugClass.TOPK_INDICES,
               TopkFamily.PREFILL_WINDOWS, summary="columns of the row returned where offsets from the window's "
                                                   "start are promised (vllm#56749)"),
)
BY_KEY = {spec.key: spec for spec in CATALOGUE}
KERNELS = tuple(spec for spec in CATALOGUE if spec.operation == OperationKind.PAGED_LOGITS)


# --------------------------------------------------------------------------- the envelope

def envelope_of(template: Contract | None) -> Contract:
    """The mutants' contract: the kernel's interface (per-row limits, block-split e4m3fn, fp32) with the
    envelope of `template` (None: the kernel's own, which takes any shape it can compile), narrowed to
    what the kernel compiles (head dims powers of two, heads a multiple of HEAD_GROUP)."""
    base = Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                    mask=MaskConvention.TAIL_NEG_INF, rtol=1e-3, head_dims=HEAD_DIMS, heads_multiple_of=HEAD_GROUP,
                    tiles=(TILE,), library=f"difftest.backends.mutants (triton, {KERNEL_FILE.name})")
    if template is None:
        return base
    dims = HEAD_DIMS if template.head_dims is None else tuple(d for d in template.head_dims if d in HEAD_DIMS)
    return dataclasses.replace(
        base, mask=template.mask, rtol=template.rtol, next_n=template.next_n, block_sizes=template.block_sizes,
        head_dims=dims, heads=template.heads, heads_multiple_of=math.lcm(HEAD_GROUP, template.heads_multiple_of),
        heads_power_of_two=template.heads_power_of_two, max_context=template.max_context,
        max_pool_bytes=template.max_pool_bytes, tiles=template.tiles or base.tiles, partition=template.partition,
        library=f"{base.library}, in the envelope of {template.library or 'the template'}")


def tile_of(contract: Contract) -> int:
    """The kernel's tile: the smallest declared tile that is a power of two in [16, 1024], else TILE."""
    fitting = [t for t in contract.tiles if 16 <= t <= 1024 and t & (t - 1) == 0]
    return min(fitting, default=TILE)


def unmet(spec: MutantSpec, contract: Contract) -> list[str]:
    """What `contract`'s envelope lacks of what `spec` needs (Requirement.PRODUCTION aside: a scale, not
    an envelope, decides that)."""
    missing = []
    if Requirement.DRAFT_ROWS in spec.needs and contract.next_n is not None and max(contract.next_n) < 2:
        missing.append(f"{Requirement.DRAFT_ROWS.value}: the contract takes next_n {list(contract.next_n)}")
    if Requirement.HEAD_GROUPS in spec.needs and contract.heads is not None and max(contract.heads) <= HEAD_GROUP:
        missing.append(f"{Requirement.HEAD_GROUPS.value}: the contract takes heads {list(contract.heads)}")
    if Requirement.BLOCKS in spec.needs and contract.block_sizes is not None and max(contract.block_sizes) <= 1:
        missing.append(f"{Requirement.BLOCKS.value}: the contract takes block sizes {list(contract.block_sizes)}")
    if Requirement.TAIL_JUDGED in spec.needs and contract.mask != MaskConvention.TAIL_NEG_INF:
        missing.append(f"{Requirement.TAIL_JUDGED.value}: the contract's mask is {contract.mask.value}")
    return missing


# --------------------------------------------------------------------------- the backend

class TritonMutant:
    """The kernel compiled with `spec`'s mutation, in the envelope `contract` says (envelope_of)."""

    def __init__(self, spec: MutantSpec, contract: Contract | None = None) -> None:
        require(spec.operation == OperationKind.PAGED_LOGITS, "mutant", spec.key,
                "a paged-logits mutant (difftest.backends.mutants.KERNELS)")
        self.spec = spec
        self.name = spec.name
        self.contract = contract or envelope_of(None)
        self.tile = tile_of(self.contract)
        self._launches = itertools.count()  # ROTATED_HEAD_SUM's start head moves on every launch

    def unavailable_reason(self, device: str) -> str | None:
        """Why the kernel cannot run on `device` ('cpu': the Triton interpreter), or None."""
        if device == "cuda":
            if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
                return "TRITON_INTERPRET is set in the environment, so Triton compiles nothing for the GPU"
            return hardware.cuda_unavailable_reason()
        return None if device == "cpu" else f"device {device!r} is neither 'cpu' (Triton interpreter) nor 'cuda'"

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [rows, max_model_len] float32, in a buffer followed by a guard that takes stores past it."""
        batch, next_n, heads, dim = inputs.q.shape
        rows, width = batch * next_n, inputs.max_model_len
        storage = torch.empty(rows * width + SPLITS * self.tile, dtype=torch.float32, device=inputs.q.device)
        interpret = inputs.q.device.type == "cpu"
        kernels = load_kernel_module(KERNEL_FILE, "difftest_mutant_kernel", interpret)
        rotation = next(self._launches) % HEAD_GROUP if self.spec.mutation == Mutation.ROTATED_HEAD_SUM else 0
        table = inputs.block_table
        # Under the interpreter numpy warns where a mutant's garbage overflows: that is its bug, not news.
        with interpreter_compat() if interpret else torch.cuda.device(inputs.q.device), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            kernels.paged_logits[(SPLITS * rows,)](
                inputs.q.view(torch.uint8), inputs.kv_cache, inputs.kv_cache.view(torch.float32), inputs.weights,
                inputs.context_lens, table, storage, next_n, inputs.block_size, table.stride(0), table.shape[1],
                inputs.kv_cache.shape[0], width, rows, rotation, H=heads, D=dim, TILE=self.tile, SPLITS=SPLITS,
                HG=HEAD_GROUP, MUTATION=int(self.spec.mutation))
        return storage[:rows * width].view(rows, width)


def template_contract(target: str | None = None) -> Contract | None:
    """The contract of the template backend `target` ('package.module:object' or a registered name; default:
    the TEMPLATE_ENV variable), None when there is none."""
    target = target if target is not None else os.environ.get(TEMPLATE_ENV)
    return load_backend(target, "backend_template").contract if target else None


def mutant(key: str, template: Contract | None = None) -> TritonMutant:
    """The mutant `key` of the catalogue in `template`'s envelope (None: the kernel's own)."""
    return TritonMutant(_entry(key, OperationKind.PAGED_LOGITS), envelope_of(template))


def topk_mutant(key: str) -> TorchTopkMutant:
    """The top-k mutant `key` of the catalogue."""
    spec = _entry(key, OperationKind.TOPK)
    return TorchTopkMutant(spec.mutation, spec.name)  # type: ignore[arg-type]


def ragged_mutant(key: str) -> RaggedMutant:
    """The ragged logits mutant `key` of the catalogue."""
    spec = _entry(key, OperationKind.RAGGED_LOGITS)
    return RaggedMutant(spec.mutation, spec.name)  # type: ignore[arg-type]


def _entry(key: str, operation: OperationKind) -> MutantSpec:
    """The catalogue's entry `key`, a mutant of `operation`; SpecError naming the keys there are."""
    spec = BY_KEY.get(key)
    if spec is None or spec.operation != operation:
        raise SpecError("mutants", key, f"one of {[s.key for s in CATALOGUE if s.operation == operation]}")
    return spec


def __getattr__(key: str) -> Callable[[], TritonMutant]:
    """`difftest.backends.mutants:<key>`: a zero-argument factory of that mutant in the envelope TEMPLATE_ENV
    names, which is how a worker process rebuilds it."""
    if key in BY_KEY and BY_KEY[key].operation == OperationKind.PAGED_LOGITS:
        return lambda: mutant(key, template_contract())
    raise AttributeError(f"module {__name__!r} has no attribute {key!r}")
