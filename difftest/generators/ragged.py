"""Ragged (prefill) logits cases: RaggedSpec (the small seeded description), build_ragged_case (its tensors),
the default random suite, and the edge families derived from a RaggedContract's declared facts (its key
tiles, its q blocks, its output form) at a Target's scale.

Every family names what it reaches (docs/reference/ragged.md lists them with the reasons); a family the
contract cannot take, or the scale leaves out, is a RaggedOmission that says why, with the numbers.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

import torch

from difftest.core.errors import require
from difftest.core.fp8 import convert
from difftest.core.kinds import Fp8Flavour, LogitsForm
from difftest.core.ragged import MAX_KEYS, MAX_ROWS, RaggedCase, RaggedContract, covered_keys
from difftest.core.schema import MAX_HEAD_DIM, MAX_HEADS, Bool, HeadDim, Int, IntList, Member, Record, Text, validate
from difftest.core.spec import Values
from difftest.generators.envelope import Scale, Target
from difftest.generators.tensors import fp8_values, head_weights, key_scales

MAX_BYTES = 1 << 33  # q (rows * H * D) and keys (keys * D) bytes each
TWO_31 = 2 ** 31
# The DeepSeek-V3.2 indexer's shape on a GPU (prefill chunks of up to 16K query tokens over 128K keys);
# a small one on the CPU, where interpreted kernels read every key of every window.
PRODUCTION_SHAPE = dict(heads=64, head_dim=128)
SMALL_SHAPE = dict(heads=32, head_dim=64)
PRODUCTION_ROWS = 16384
PRODUCTION_KEYS = 131072
SMALL_MAX_KEYS = 1024
# Representative values where the contract takes any.
REPRESENTATIVE = {Scale.SMALL: dict(heads=(16, 32, 64), head_dim=(32, 64, 128)),
                  Scale.PRODUCTION: dict(heads=(32, 64, 128), head_dim=(64, 128))}
DEFAULT_TILES = (64,)  # key tiles assumed for a contract that declares none: the fused oracle's and AITER's multiple
# difftest.engine.comparison compares 2^25 logits at a time, ~48 bytes each (restated: generators may not import
# the engine; envelope.COMPARE_BYTES_PER_LOGIT is the same number).
COMPARE_BYTES = 48 << 25


class RaggedWindows(str, enum.Enum):
    """How each row's window [k_start, k_end) is drawn (explicit starts and ends override it)."""

    RANDOM = "random"  # start uniform on [0, keys], end uniform on [start, keys]
    FULL = "full"  # [0, keys)
    # Chunked prefill: requests laid end to end in the key buffer, each its context then its query tokens; row t
    # of a request starting at s with context c sees [s, s + c + t + 1) (vLLM's prefill chunk metadata).
    STAIRCASE = "staircase"


def _positions(what: str) -> Any:
    return IntList(0, MAX_KEYS, MAX_ROWS, f"a list of {what} in [0, {MAX_KEYS}]", as_tuple=True)


@dataclasses.dataclass(frozen=True)
class RaggedSpec(Record):
    """Structure and distributions of a ragged case. A STAIRCASE's requests are `contexts` and `query_lens`
    when given, else `requests` of them drawn to fill `rows` and `keys` exactly. The spec's one definition:
    its fields, their defaults and (Annotated) the bounds a spec read from JSON keeps (RaggedSpec.from_json)."""

    name: Text(256, 1) = "random"
    rows: Int(1, MAX_ROWS) = 8
    keys: Int(1, MAX_KEYS) = 256
    heads: Int(1, MAX_HEADS) = 32
    head_dim: HeadDim = 64
    windows: Member(RaggedWindows) = RaggedWindows.RANDOM
    starts: _positions("window starts") | None = None  # explicit windows: one start and one end per row
    ends: _positions("window ends") | None = None
    contexts: _positions("request contexts") | None = None  # STAIRCASE: each request's keys before its first query
    query_lens: _positions("request query lengths") | None = None  # STAIRCASE: each request's query rows
    requests: Int(1, MAX_ROWS) = 2  # STAIRCASE drawn: how many requests
    values: Member(Values) = Values.NORMAL
    fp8: Member(Fp8Flavour) = Fp8Flavour.E4M3FN
    max_seqlen_k: Int(1, MAX_KEYS) | None = None  # as a caller passes it; None: the longest window
    canaries: Bool = True  # keys no window holds are NaN (key bytes and scale): a kernel reading them shows

    def replace(self, **changes: Any) -> RaggedSpec:
        """This spec with `changes` (not validated: validate() or build_ragged_case does that)."""
        return dataclasses.replace(self, **changes)

    def validate(self) -> RaggedSpec:
        """SpecError naming the first field that cannot describe a case."""
        require(1 <= self.rows <= MAX_ROWS, "rows", self.rows, f"an integer in [1, {MAX_ROWS}]")
        require(1 <= self.keys <= MAX_KEYS, "keys", self.keys, f"an integer in [1, {MAX_KEYS}]")
        require(1 <= self.heads <= MAX_HEADS, "heads", self.heads, f"an integer in [1, {MAX_HEADS}]")
        require(16 <= self.head_dim <= MAX_HEAD_DIM and self.head_dim % 16 == 0, "head_dim", self.head_dim,
                "a positive multiple of 16")
        require(self.rows * self.heads * self.head_dim <= MAX_BYTES, "rows", self.rows,
                f"rows * heads * head_dim <= {MAX_BYTES}")
        require(self.keys * self.head_dim <= MAX_BYTES, "keys", self.keys, f"keys * head_dim <= {MAX_BYTES}")
        require(self.max_seqlen_k is None or self.max_seqlen_k >= 1, "max_seqlen_k", self.max_seqlen_k,
                "None or an integer >= 1")
        self._validate_windows()
        return self

    def _validate_windows(self) -> None:
        require((self.starts is None) == (self.ends is None), "starts", self.starts, "given together with ends")
        if self.starts is not None and self.ends is not None:
            require(len(self.starts) == self.rows and len(self.ends) == self.rows, "starts", len(self.starts),
                    f"{self.rows} starts and {self.rows} ends (one window per row)")
            require(all(0 <= s <= e <= self.keys for s, e in zip(self.starts, self.ends, strict=True)), "ends",
                    _shown(self.ends), f"windows with 0 <= start <= end <= keys = {self.keys}")
        require((self.contexts is None) == (self.query_lens is None), "contexts", self.contexts,
                "given together with query_lens")
        if self.contexts is not None and self.query_lens is not None:
            require(self.windows == RaggedWindows.STAIRCASE, "windows", self.windows.value,
                    "'staircase' where contexts and query_lens are given")
            require(len(self.contexts) == len(self.query_lens) >= 1, "query_lens", _shown(self.query_lens),
                    f"one query length per context ({len(self.contexts)})")
            require(min(self.query_lens) >= 1 and sum(self.query_lens) == self.rows, "query_lens",
                    _shown(self.query_lens), f"lengths >= 1 summing to rows = {self.rows}")
            used = sum(self.contexts) + self.rows
            require(min(self.contexts) >= 0 and used <= self.keys, "contexts", _shown(self.contexts),
                    f"contexts >= 0 whose requests fit the buffer: sum(contexts) + rows <= keys = {self.keys}")
        elif self.windows == RaggedWindows.STAIRCASE:
            require(1 <= self.requests <= self.rows, "requests", self.requests,
                    f"an integer in [1, rows = {self.rows}]")
            require(self.keys >= self.rows, "keys", self.keys,
                    f"at least rows = {self.rows} (each query token is a key)")

    def longest(self) -> int:
        """The longest window a case of this spec can have (exact for explicit windows and requests)."""
        if self.starts is not None and self.ends is not None:
            return max(e - s for s, e in zip(self.starts, self.ends, strict=True))
        if self.contexts is not None and self.query_lens is not None:
            return max(c + n for c, n in zip(self.contexts, self.query_lens, strict=True))
        return self.keys

    def width(self, form: LogitsForm) -> int:
        """Columns of an output row in `form`: keys, or max_seqlen_k (the longest window where none is given)."""
        if form == LogitsForm.ABSOLUTE:
            return self.keys
        return self.max_seqlen_k if self.max_seqlen_k is not None else max(1, self.longest())

    @classmethod
    def from_json(cls, data: object, where: str = "") -> RaggedSpec:
        """The spec of to_json's JSON (fields left out keep their defaults); SpecError naming the first field
        that does not fit ('starts[2]'), or that validate() refuses."""
        return validate(cls, data, where, root="spec").validate()

    def checked(self) -> None:
        """The q and key bytes a case of this spec allocates, bounded (a spec read from JSON)."""
        require(self.rows * self.heads * self.head_dim <= MAX_BYTES, "spec.rows", self.rows,
                f"rows * heads * head_dim <= {MAX_BYTES}")
        require(self.keys * self.head_dim <= MAX_BYTES, "spec.keys", self.keys, f"keys * head_dim <= {MAX_BYTES}")


def _shown(values: tuple[int, ...] | None) -> str:
    return repr(values if values is None or len(values) <= 8 else [*values[:8], "..."])


# --------------------------------------------------------------------------- building

def ragged_case_name(spec: RaggedSpec, seed: int) -> str:
    """'tile-256-ends-s3': the name of the case drawn from (spec, seed)."""
    return f"{spec.name}-s{seed}"


def build_ragged_case(spec: RaggedSpec, seed: int, device: str | torch.device = "cpu") -> RaggedCase:
    """The case `spec` describes, drawn from torch.Generator(device).manual_seed(seed); the same (spec, seed,
    device type) always gives bit-identical tensors. Windows first, then q, keys, scales and weights, with
    the value distributions of paged cases (difftest.generators.tensors); keys no window holds become NaN
    canaries where the spec asks. No Python loop over rows or keys."""
    spec = spec.validate()
    gen = torch.Generator(device=device).manual_seed(seed)
    starts, ends = draw_windows(spec, gen, device)
    q = fp8_values(spec.values, (spec.rows, spec.heads, spec.head_dim), gen, device)
    k = fp8_values(spec.values, (spec.keys, spec.head_dim), gen, device)
    scales = key_scales(spec.values, (spec.keys,), gen, device)
    weights = head_weights(spec.values, (spec.rows, spec.heads), gen, device)
    if spec.canaries:
        unread = ~covered_keys(starts, ends, spec.keys)
        k.masked_fill_(unread[:, None], Fp8Flavour.E4M3FN.nan_byte)
        scales.masked_fill_(unread, math.nan)
    case = RaggedCase(name=ragged_case_name(spec, seed), q=convert(q, Fp8Flavour.E4M3FN, spec.fp8, "q"),
                      k=convert(k, Fp8Flavour.E4M3FN, spec.fp8, "k"), k_scale=scales, weights=weights,
                      k_start=starts, k_end=ends, max_seqlen_k=spec.max_seqlen_k, fp8=spec.fp8,
                      meta={"seed": seed, "spec": spec.to_json()})
    return case.validate()


def draw_windows(spec: RaggedSpec, gen: torch.Generator, device: str | torch.device) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
    """int64 [rows] starts and ends of the spec's windows."""
    i64, rows, keys = torch.int64, spec.rows, spec.keys
    if spec.starts is not None and spec.ends is not None:
        return (torch.tensor(spec.starts, dtype=i64, device=device), torch.tensor(spec.ends, dtype=i64, device=device))
    if spec.windows == RaggedWindows.FULL:
        return torch.zeros(rows, dtype=i64, device=device), torch.full((rows,), keys, dtype=i64, device=device)
    if spec.windows == RaggedWindows.STAIRCASE:
        contexts, query_lens = _requests(spec, gen, device)
        return staircase(contexts, query_lens)
    starts = torch.randint(0, keys + 1, (rows,), generator=gen, device=device)
    spans = (torch.rand(rows, generator=gen, device=device) * (keys - starts + 1)).floor().to(i64)
    return starts, starts + spans.clamp(max=keys - starts)


def staircase(contexts: torch.Tensor, query_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 (starts, ends) of chunked prefill: requests end to end, each its context then its query tokens;
    query token t of a request starting at s with context c sees [s, s + c + t + 1)."""
    first_key = torch.cumsum(contexts + query_lens, 0) - (contexts + query_lens)
    first_row = torch.cumsum(query_lens, 0) - query_lens
    request = torch.repeat_interleave(torch.arange(len(query_lens), device=query_lens.device), query_lens)
    token = torch.arange(len(request), device=query_lens.device) - first_row[request]
    starts = first_key[request]
    return starts, starts + contexts[request] + token + 1


def _requests(spec: RaggedSpec, gen: torch.Generator, device: str | torch.device) -> tuple[torch.Tensor,
                                                                                           torch.Tensor]:
    """int64 (contexts, query_lens): the spec's own, or `requests` of them drawn so that the query lengths
    (each >= 1) sum to rows and the requests fill the keys exactly."""
    i64 = torch.int64
    if spec.contexts is not None and spec.query_lens is not None:
        return (torch.tensor(spec.contexts, dtype=i64, device=device),
                torch.tensor(spec.query_lens, dtype=i64, device=device))
    n = spec.requests
    cuts = torch.randperm(spec.rows - 1, generator=gen, device=device)[:n - 1].sort().values + 1
    query_lens = torch.diff(cuts, prepend=cuts.new_zeros(1), append=cuts.new_full((1,), spec.rows))
    spare = spec.keys - spec.rows
    context_cuts = torch.randint(0, spare + 1, (n - 1,), generator=gen, device=device).sort().values
    contexts = torch.diff(context_cuts, prepend=context_cuts.new_zeros(1), append=context_cuts.new_full((1,), spare))
    return contexts.to(i64), query_lens.to(i64)


# --------------------------------------------------------------------------- which cases

class RaggedFamily(str, enum.Enum):
    """A named kind of ragged edge case; a report says which families a run reached."""

    RANDOM = "random"  # drawn windows and chunked-prefill requests
    TILE_ENDS = "tile-ends"  # windows whose lengths and ends sit at k * tile - 1, k * tile, k * tile + 1
    EMPTY_WINDOWS = "empty-windows"  # k_start == k_end at 0, inside, at the buffer's end; a whole q block of them
    BUFFER_END = "buffer-end"  # windows reaching the last key of a buffer of no tile's (nor 4's) multiple
    STAIRCASE = "staircase"  # the causal staircase of chunked prefill, requests starting unaligned
    KS_UNALIGNED = "ks-unaligned"  # k_start not a multiple of the start alignment (DeepGEMM's 4) nor of 4
    ROW_COUNTS = "row-counts"  # one row; rows not a multiple of the q block
    DISJOINT_BLOCKS = "disjoint-blocks"  # q blocks whose rows' windows lie far apart (canaries between)
    MAX_SEQLEN_K = "max-seqlen-k"  # max_seqlen_k past the longest window, a multiple of nothing
    LONG_WINDOWS = "long-windows"  # a window longer than max_seqlen_k: outside every window-relative contract
    KEYS_2_31_BYTES = "keys-2^31-bytes"  # windows around key index * D = 2^31
    LOGITS_2_31_ELEMENTS = "logits-2^31-elements"  # rows * width past 2^31, the last rows' windows long
    HEADS = "heads"
    HEAD_DIMS = "head-dims"
    VALUES = "values"  # heavy-tailed and integer-exact values
    FP8_FLAVOURS = "fp8-flavours"
    PRODUCTION = "production"  # rows up to 16K over keys up to 128K, H 64, D 128 (GPU scale)


@dataclasses.dataclass(frozen=True)
class RaggedPlanned:
    """A spec and the families it reaches."""

    spec: RaggedSpec
    families: tuple[RaggedFamily, ...]


@dataclasses.dataclass(frozen=True)
class RaggedOmission:
    """A family (or one case of it) left out, and why, with the numbers."""

    family: RaggedFamily
    reason: str
    spec_name: str = ""


def default_ragged_specs() -> list[RaggedSpec]:
    """The random suite: drawn windows over 256 keys, chunked prefill of three requests over 300, whole-buffer
    windows; H 32, D 64."""
    return [RaggedSpec(name="random-windows", rows=8, keys=256),
            RaggedSpec(name="random-staircase", rows=12, keys=300, windows=RaggedWindows.STAIRCASE, requests=3),
            RaggedSpec(name="random-full", rows=4, keys=200, windows=RaggedWindows.FULL)]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What every family builder reads: the contract, the target and the spec cases start from."""

    contract: RaggedContract
    target: Target
    base: RaggedSpec
    tiles: tuple[int, ...]  # key tiles, ascending
    block_q: int  # query rows per q block (1 where unknown)

    @property
    def small(self) -> bool:
        return self.target.scale == Scale.SMALL

    @property
    def max_keys(self) -> int:
        return SMALL_MAX_KEYS if self.small else PRODUCTION_KEYS

    def windows(self, name: str, windows: list[tuple[int, int]], keys: int, **fields: Any) -> RaggedSpec:
        """The base spec with these explicit windows."""
        return self.base.replace(name=name, rows=len(windows), keys=keys, starts=tuple(s for s, _ in windows),
                                 ends=tuple(e for _, e in windows), **fields)


Built = list[RaggedPlanned | RaggedOmission]


def ragged_plan(contract: RaggedContract, target: Target) -> Built:
    """Every family for a kernel of `contract` at `target`'s scale: the specs it takes, and an omission with the
    reason for each one it does not (the contract's own reason, the scale's, or the memory's)."""
    plan = _make_plan(contract, target)
    out: Built = []
    for item in (i for builder in _BUILDERS for i in builder(plan)):
        if isinstance(item, RaggedOmission):
            out.append(item)
            continue
        reason = refused(contract, item.spec) or _scale_reason(item.spec, target) or \
            _memory_reason(item.spec, contract, target)
        out.append(item if reason is None else RaggedOmission(item.families[0], f"{item.spec.name}: {reason}",
                                                              item.spec.name))
    return out


def refused(contract: RaggedContract, spec: RaggedSpec) -> str | None:
    """Why the contract cannot take cases of `spec` (dimensions; windows its output form cannot hold), or None."""
    reason = contract.shape_reason(spec.rows, spec.keys, spec.heads, spec.head_dim)
    if reason:
        return reason
    if contract.form == LogitsForm.WINDOW_RELATIVE and spec.longest() > spec.width(contract.form):
        return (f"a window of {spec.longest()} keys is longer than max_seqlen_k = {spec.width(contract.form)}: a "
                f"window-relative row holds max_seqlen_k columns")
    return None


def footprint(spec: RaggedSpec, contract: RaggedContract) -> int:
    """Bytes a run of `spec` holds at its peak (upper bounds): the case, the kernel's output and the oracle's
    (float32 [rows, width] each, plus a rotated copy of an ABSOLUTE output), and one chunk of comparison."""
    case = spec.rows * spec.heads * (spec.head_dim + 4) + spec.keys * (spec.head_dim + 4) + spec.rows * 16
    logits = spec.rows * spec.width(contract.form) * 4
    rotated = logits if contract.form == LogitsForm.ABSOLUTE else 0
    return case + 2 * logits + rotated + min(COMPARE_BYTES, spec.rows * spec.width(contract.form) * 48)


def _scale_reason(spec: RaggedSpec, target: Target) -> str | None:
    if target.scale == Scale.SMALL and spec.keys > SMALL_MAX_KEYS:
        return f"needs {spec.keys} keys; SMALL scale keeps keys <= {SMALL_MAX_KEYS} for a CPU run"
    return None


def _memory_reason(spec: RaggedSpec, contract: RaggedContract, target: Target) -> str | None:
    need = footprint(spec, contract)
    if need <= target.memory_bytes:
        return None
    return f"needs {need / 1e9:.1f} GB (case, output, oracle, comparison), {target.memory_bytes / 1e9:.1f} GB allowed"


def _make_plan(contract: RaggedContract, target: Target) -> _Plan:
    shape = SMALL_SHAPE if target.scale == Scale.SMALL else PRODUCTION_SHAPE
    heads = _nearest(contract.heads, shape["heads"], contract.powers_of_two)
    head_dim = _nearest(contract.head_dims, shape["head_dim"], contract.powers_of_two)
    tiles = tuple(sorted(set(contract.tiles.kv))) or DEFAULT_TILES
    base = RaggedSpec(heads=heads, head_dim=head_dim)
    return _Plan(contract, target, base, tiles, contract.tiles.block_q(heads) or 1)


def _nearest(allowed: tuple[int, ...] | None, wanted: int, power_of_two: bool) -> int:
    """The allowed value nearest `wanted` on a log scale (the larger on a tie); `wanted` where any is allowed."""
    values = [v for v in (allowed or (wanted,)) if not power_of_two or v & (v - 1) == 0] or list(allowed or (wanted,))
    return min(values, key=lambda v: (abs(math.log2(v / wanted)), -v))


def _supported(plan: _Plan, field: str) -> tuple[int, ...]:
    declared = plan.contract.heads if field == "heads" else plan.contract.head_dims
    values = declared if declared is not None else REPRESENTATIVE[plan.target.scale][field]
    return tuple(v for v in sorted(values) if not plan.contract.powers_of_two or v & (v - 1) == 0)


# --------------------------------------------------------------------------- families

def _randoms(plan: _Plan) -> Built:
    """RANDOM, VALUES, FP8_FLAVOURS: the default suite's shapes at the base's heads and head dim; heavy-tailed
    and integer-exact values; e4m3fnuz (the base is e4m3fn)."""
    shape = dict(heads=plan.base.heads, head_dim=plan.base.head_dim)
    out: Built = [RaggedPlanned(spec.replace(**shape), (RaggedFamily.RANDOM,)) for spec in default_ragged_specs()]
    for name, values in (("heavy-tailed-values", Values.HEAVY), ("integer-exact", Values.INTEGER)):
        out.append(RaggedPlanned(plan.base.replace(name=name, rows=8, keys=256, values=values), (RaggedFamily.VALUES,)))
    out.append(RaggedPlanned(plan.base.replace(name="e4m3fnuz-flavour", rows=6, keys=200, fp8=Fp8Flavour.E4M3FNUZ),
                             (RaggedFamily.FP8_FLAVOURS,)))
    return out


def _tile_ends(plan: _Plan) -> Built:
    """TILE_ENDS: for every key tile t, windows of k*t - 1, k*t and k*t + 1 keys (k = 1, 2, and at production
    scale the largest k that fits) starting at key 0 and at key 3, in a buffer 2 keys longer than the longest
    window needs; the longest window, 2t + 1 keys, is no tile's multiple, so neither is max_seqlen_k."""
    out: Built = []
    for tile in plan.tiles:
        top = (plan.max_keys - 8) // tile
        multiples = sorted({k for k in (1, 2) if k <= top} | (set() if plan.small or top <= 2 else {top}))
        if not multiples:
            reason = f"tile {tile}: a window of {tile + 1} keys needs more than the scale's {plan.max_keys} keys"
            out.append(RaggedOmission(RaggedFamily.TILE_ENDS, reason, f"tile-{tile}-ends"))
            continue
        lengths = sorted({k * tile + d for k in multiples for d in (-1, 0, 1)})
        windows = [(start, start + n) for start in (0, 3) for n in lengths]
        out.append(RaggedPlanned(plan.windows(f"tile-{tile}-ends", windows, keys=3 + lengths[-1] + 2),
                                 (RaggedFamily.TILE_ENDS,)))
    return out


def _empty_and_end(plan: _Plan) -> Built:
    """EMPTY_WINDOWS and BUFFER_END. Empty windows at key 0, inside, at the buffer's end, and a whole q block
    of them between rows that score; windows reaching the last key of a buffer of 2 * t + 3 keys (t the
    largest tile: no tile's multiple, and 3 past a multiple of 4), from its first key, from one past it, from
    4 and t + 1 keys before its end and from its last key."""
    tile, q = plan.tiles[-1], plan.block_q
    keys = max(2 * plan.tiles[0] + 5, 45)
    empty = [(0, 0), (0, 7), (7, 7), (3, 40), *[(40, 40)] * q, (keys - 5, keys), (keys, keys)]
    end = 2 * tile + 3
    reaching = [(end - 1, end), (end - tile - 1, end), (0, end), (1, end), (end - 4, end), (end - tile, end)]
    return [RaggedPlanned(plan.windows("empty-windows", empty, keys), (RaggedFamily.EMPTY_WINDOWS,)),
            RaggedPlanned(plan.windows("buffer-end", reaching, end), (RaggedFamily.BUFFER_END,))]


def _staircases(plan: _Plan) -> Built:
    """STAIRCASE: chunked prefill of four requests, contexts 0, 37, t - 2 and 2t + 1 (t the largest tile) with
    5, 4, 1 and 6 query rows: requests start at unaligned keys, one has no context, one a single row. At
    production scale: two requests of 8192 query rows after 57344 keys of context each (16384 rows over
    131072 keys, H 64, D 128)."""
    tile = plan.tiles[-1]
    contexts, query_lens = (0, 37, tile - 2, 2 * tile + 1), (5, 4, 1, 6)
    spec = plan.base.replace(name="chunked-prefill", rows=sum(query_lens), keys=sum(contexts) + sum(query_lens),
                             windows=RaggedWindows.STAIRCASE, contexts=contexts, query_lens=query_lens)
    out: Built = [RaggedPlanned(spec, (RaggedFamily.STAIRCASE,))]
    if plan.small:
        out.append(RaggedOmission(RaggedFamily.PRODUCTION, f"{PRODUCTION_ROWS} rows over {PRODUCTION_KEYS} keys at "
                                                           "H 64, D 128: GPU (production) scale only"))
        return out
    half = PRODUCTION_ROWS // 2
    context = PRODUCTION_KEYS // 2 - half
    chunk = plan.base.replace(name="production-staircase", rows=PRODUCTION_ROWS, keys=PRODUCTION_KEYS,
                              windows=RaggedWindows.STAIRCASE, contexts=(context, context), query_lens=(half, half))
    drawn = plan.base.replace(name="production-random", rows=PRODUCTION_ROWS // 4, keys=PRODUCTION_KEYS)
    return [*out, RaggedPlanned(chunk, (RaggedFamily.PRODUCTION, RaggedFamily.STAIRCASE)),
            RaggedPlanned(drawn, (RaggedFamily.PRODUCTION, RaggedFamily.RANDOM))]


def _alignment(plan: _Plan) -> Built:
    """KS_UNALIGNED, ROW_COUNTS, DISJOINT_BLOCKS. Starts 1, 2, 3, 5, 6, 7 past a multiple of the start
    alignment (and of 4) with windows across tiles; one row; BLOCK_Q + 1 and 2 * BLOCK_Q - 1 rows (3 and 5
    where the q block is one row or unknown); q blocks whose rows alternate between windows at the buffer's
    two ends, NaN canaries between, and an empty row in the last block."""
    tile, q, align = plan.tiles[-1], plan.block_q, max(plan.contract.tiles.start_align, 4)
    starts = [align * 2 + d for d in (1, 2, 3, 5, 6, 7)]
    lengths = (tile, tile + 1, 2 * tile - 1, 1, 70, 2 * tile + 9)
    unaligned = [(s, s + n) for s, n in zip(starts, lengths, strict=True)]
    keys = max(e for _, e in unaligned) + 1
    out: Built = [RaggedPlanned(plan.windows("ks-unaligned", unaligned, keys), (RaggedFamily.KS_UNALIGNED,)),
                  RaggedPlanned(plan.windows("rows-1", [(3, tile + 5)], tile + 9), (RaggedFamily.ROW_COUNTS,))]
    for rows in sorted({q + 1, 2 * q - 1} if q > 1 else {3, 5}):
        out.append(RaggedPlanned(plan.base.replace(name=f"rows-{rows}", rows=rows, keys=2 * tile + 3),
                                 (RaggedFamily.ROW_COUNTS,)))
    far = 2 * tile + 64
    pairs = [(0, 50) if row % 2 == 0 else (far - 60, far - 10) for row in range(2 * max(q, 2) - 1)] + [(9, 9)]
    out.append(RaggedPlanned(plan.windows("disjoint-blocks", pairs, far), (RaggedFamily.DISJOINT_BLOCKS,)))
    return out


def _max_seqlen_k(plan: _Plan) -> Built:
    """MAX_SEQLEN_K: max_seqlen_k 7 past the longest window (t + 1 keys), as vLLM passes the chunk's longest
    request to every row; LONG_WINDOWS: a window one key longer than max_seqlen_k (a window-relative kernel's
    row cannot hold it: RaggedContract.window_reason refuses it, and this family is its omission there)."""
    tile = plan.tiles[0]
    slack = plan.windows("max-seqlen-k-slack", [(0, tile), (5, tile + 6), (2, 2), (tile, 2 * tile - 3)],
                         2 * tile + 1, max_seqlen_k=tile + 8)
    long = plan.windows("windows-past-max-seqlen-k", [(0, tile + 1), (3, 9)], tile + 4, max_seqlen_k=tile)
    return [RaggedPlanned(slack, (RaggedFamily.MAX_SEQLEN_K,)), RaggedPlanned(long, (RaggedFamily.LONG_WINDOWS,))]


def _dimensions(plan: _Plan) -> Built:
    """HEADS, HEAD_DIMS: every supported value other than the base's, at the base's other dimension."""
    out: Built = []
    for field, family in (("heads", RaggedFamily.HEADS), ("head_dim", RaggedFamily.HEAD_DIMS)):
        for value in _supported(plan, field):
            if value != getattr(plan.base, field):
                spec = plan.base.replace(name=f"{field.replace('_', '-')}-{value}", rows=6, keys=200, **{field: value})
                out.append(RaggedPlanned(spec, (family,)))
    return out


def _sizes(plan: _Plan) -> Built:
    """KEYS_2_31_BYTES and LOGITS_2_31_ELEMENTS, production scale only. A buffer of 2^31 / D keys and 2t + 3
    more, windows straddling key 2^31 / D (byte 2^31), reaching the end, and one near the start; rows x
    width just past 2^31 at width 131072 (16385 rows of short windows cycling over the buffer, the last three
    rows long: the whole buffer, its last 300 keys, all but its ends)."""
    if plan.small:
        keys, rows = TWO_31 // plan.base.head_dim, TWO_31 // PRODUCTION_KEYS + 1
        small = f"SMALL scale keeps keys <= {SMALL_MAX_KEYS}"
        return [RaggedOmission(RaggedFamily.KEYS_2_31_BYTES,
                               f"needs {keys} keys of {plan.base.head_dim} bytes (2^31 bytes); {small}"),
                RaggedOmission(RaggedFamily.LOGITS_2_31_ELEMENTS,
                               f"needs rows * width > 2^31 ({rows} rows x {PRODUCTION_KEYS}); {small}")]
    tile = plan.tiles[-1]
    boundary = TWO_31 // plan.base.head_dim
    keys = boundary + 2 * tile + 3
    straddling = [(boundary - 70, boundary + 70), (boundary - tile - 1, keys), (keys - 1, keys), (0, 40),
                  (boundary, boundary + 1), (boundary - 1, boundary)]
    width = PRODUCTION_KEYS
    rows = TWO_31 // width + 1
    short = [((row * 7919) % (width - 16), (row * 7919) % (width - 16) + 16) for row in range(rows - 3)]
    long = [*short, (0, width), (width - 300, width), (1, width - 1)]
    return [RaggedPlanned(plan.windows("keys-past-2^31-bytes", straddling, keys), (RaggedFamily.KEYS_2_31_BYTES,)),
            RaggedPlanned(plan.windows("logits-past-2^31-elements", long, width, max_seqlen_k=width),
                          (RaggedFamily.LOGITS_2_31_ELEMENTS,))]


_BUILDERS = (_randoms, _tile_ends, _empty_and_end, _staircases, _alignment, _max_seqlen_k, _dimensions, _sizes)
