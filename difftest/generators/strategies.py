"""Hypothesis strategies: draw a case's structure (a spec), then build its tensors with the operation's builder.

Only the structure is drawn by hypothesis; the tensors come from torch's seeded RNG, so a shrunk
example is the small spec and the seed that `build_case(spec, seed)` replays anywhere. Draws are
ordered so that shrinking moves toward fewer sequences, shorter lengths, smaller next_n, the first
listed block size / H / D, no padding, plain tables (no sharing, canary stale entries, no extra
column), integer values, e4m3fn, and seed 0.

Given a backend's contract, every strategy draws only what the contract takes (`contract.accepts(case,
device)` is None for every example): a kernel declaring next_n (1, 2, 4) never sees next_n 3, and no
example is thrown away (a contract-refused case would skip its check, and a skip ends a `@given` test).
`paged_cases(contract=...)`, `topk_cases(contract)` and `ragged_cases(contract)` are the three; `for_contract`
picks the one of a contract's type.

    from difftest.generators.strategies import cases

    @given(cases(max_batch=3, block_sizes=(16,)))
    def test_my_kernel(case): ...

    @given(for_contract(my_kernel.difftest_contract))
    def test_inside_the_envelope(case): ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from difftest.core.case import Case
from difftest.core.contract import Contract
from difftest.core.kinds import Fp8Flavour, LengthEncoding, RowStride, WindowForm
from difftest.core.ragged import RaggedCase, RaggedContract
from difftest.core.spec import CaseSpec, Stale, Values
from difftest.core.topk import TopkCase, TopkContract
from difftest.generators.ragged import RaggedSpec, RaggedWindows, build_ragged_case
from difftest.generators.tensors import build_case
from difftest.generators.topk import Outside, TopkSpec, TopkValues, WindowDist, build_topk_case

# Simplest first: sampled_from shrinks toward the first element.
VALUES_ORDER = (Values.INTEGER, Values.NORMAL, Values.HEAVY)
STALE_ORDER = (Stale.CANARY, Stale.ZERO, Stale.OTHER)
FP8_ORDER = (Fp8Flavour.E4M3FN, Fp8Flavour.E4M3FNUZ)
TOPK_VALUES_ORDER = (TopkValues.INTEGER, TopkValues.NORMAL, TopkValues.EQUAL, TopkValues.TIED, TopkValues.HEAVY,
                     TopkValues.CROWDED)
OUTSIDE_ORDER = (Outside.NEG_INF, Outside.HOSTILE, Outside.RANDOM)
# The window distributions each top-k window form can tell its kernel (difftest.core.topk.TopkContract.window_reason)
TOPK_WINDOWS = {WindowForm.STARTS_ENDS: (WindowDist.FULL, WindowDist.PREFIX, WindowDist.RAGGED, WindowDist.DECODE),
                WindowForm.STARTS_LENGTHS: (WindowDist.FULL, WindowDist.PREFIX, WindowDist.RAGGED, WindowDist.DECODE),
                WindowForm.LENGTHS: (WindowDist.FULL, WindowDist.PREFIX, WindowDist.DECODE),
                WindowForm.DECODE_RULE: (WindowDist.DECODE,)}
RAGGED_WINDOWS_ORDER = (RaggedWindows.FULL, RaggedWindows.RANDOM, RaggedWindows.STAIRCASE)
MAX_SEED = 2**32 - 1
FLATTENED = (LengthEncoding.FLATTENED, LengthEncoding.FLATTENED_INDICES)  # one request handed per row


def specs(*, max_batch: int = 4, max_next_n: int = 4, heads: Sequence[int] | None = None,
          head_dims: Sequence[int] | None = None, block_sizes: Sequence[int] | None = None,
          max_model_len: int = 128, max_padding: int = 2, max_extra_columns: int = 1,
          values: Sequence[Values] = VALUES_ORDER, fp8: Sequence[Fp8Flavour] | None = None,
          contract: Contract | None = None, device: str = "cpu",
          name: str = "hypothesis") -> st.SearchStrategy[CaseSpec]:
    """A strategy for CaseSpecs with every length given explicitly (`lengths`, so B = len(lengths)).

    Draws next_n in [1, max_next_n], a block size, H and D from the given choices (by default (1, 4, 32, 64),
    (16, 64, 128) and (16, 1, 64)), 1..max_batch lengths in [0, max_model_len] (some of them from the edges
    of docs/reference/bug-classes.md: 0, 1, around next_n and around block multiples), 0..max_padding trailing
    padding requests, shared prefix blocks or not, the stale-entry kind, 0..max_extra_columns extra table
    columns, the values family and the fp8 flavour (both by default).

    With `contract` (a paged backend's Contract), only what it takes on `device`: the next_n values, H, D and
    block sizes it lists (the given choices it takes, or its own lists where none are given), its fp8 flavour,
    at most its max_context, its max_batch requests a call and its max_pool_bytes of cache; InvalidArgument
    naming the argument when nothing is left to draw.

    Shrinks toward fewer sequences, shorter lengths, next_n 1, the first listed block size, H and D,
    no padding, no sharing, canary stale entries, no extra column, the first listed values family
    (integer by default) and the first listed fp8 flavour.
    """
    for field, value, least in (("max_batch", max_batch, 1), ("max_next_n", max_next_n, 1),
                                ("max_model_len", max_model_len, 1), ("max_padding", max_padding, 0),
                                ("max_extra_columns", max_extra_columns, 0)):
        _check_bound(field, value, least)
    _check_choices("values", values, lambda v: isinstance(v, Values), "a difftest.generators.Values")
    envelope = _PagedEnvelope(contract, device)
    chosen = dict(
        next_ns=_allowed("max_next_n", range(1, max_next_n + 1), envelope.takes_next_n, contract),
        heads=_allowed("heads", _given("heads", heads, (1, 4, 32, 64), envelope.listed("heads"),
                                       lambda h: isinstance(h, int) and h >= 1, "a positive int"),
                       envelope.takes_heads, contract),
        head_dims=_allowed("head_dims", _given("head_dims", head_dims, (16, 64, 128), envelope.listed("head_dims"),
                                               lambda d: isinstance(d, int) and d >= 16 and d % 16 == 0,
                                               "a positive multiple of 16"), envelope.takes_head_dim, contract),
        block_sizes=_allowed("block_sizes", _given("block_sizes", block_sizes, (16, 1, 64),
                                                   envelope.listed("block_sizes"),
                                                   lambda b: isinstance(b, int) and b >= 1, "a positive int"),
                             envelope.takes_block_size, contract),
        fp8=_given("fp8", fp8, FP8_ORDER, (contract.fp8,) if contract else None,
                   lambda f: isinstance(f, Fp8Flavour), "a difftest.Fp8Flavour"))
    context = min(max_model_len, contract.max_context or max_model_len) if contract else max_model_len
    return _specs(**chosen, max_batch=max_batch, max_model_len=context, max_padding=max_padding,
                  max_extra_columns=max_extra_columns, values=tuple(values), name=name, envelope=envelope)


class _PagedEnvelope:
    """What a paged contract takes (every value when there is none), as the strategy asks it."""

    def __init__(self, contract: Contract | None, device: str) -> None:
        self.contract = contract
        if contract is not None:
            _check_device(device, contract.devices)

    def listed(self, field: str) -> tuple[int, ...] | None:
        """The contract's own list of `field` (heads, head_dims, block_sizes), sorted; None: it lists none."""
        allowed = getattr(self.contract, field, None)
        return tuple(sorted(allowed)) if allowed is not None else None

    def takes_next_n(self, next_n: int) -> bool:
        return self._dims_reason(next_n=next_n) is None and self.requests_per_sequence(next_n) <= self.max_requests

    def takes_heads(self, heads: int) -> bool:
        return self._dims_reason(heads=heads) is None

    def takes_head_dim(self, head_dim: int) -> bool:
        return self._dims_reason(head_dim=head_dim) is None

    def takes_block_size(self, block_size: int) -> bool:
        return self._dims_reason(block_size=block_size) is None

    def _dims_reason(self, **one: int) -> str | None:
        """The contract's reason to refuse a case differing from a taken one in the one dimension given."""
        if self.contract is None:
            return None
        dims = dict(next_n=self._first("next_n", 1), heads=self._first("heads", self.contract.heads_multiple_of),
                    head_dim=self._first("head_dims", 16), block_size=self._first("block_sizes", 1)) | one
        return self.contract.shape_reason(**dims)

    def _first(self, field: str, default: int) -> int:
        listed = getattr(self.contract, field)
        return min(listed) if listed else default

    @property
    def max_requests(self) -> int:
        """The most requests the kernel takes in one call (its max_batch)."""
        return self.contract.max_batch if self.contract and self.contract.max_batch is not None else 1 << 62

    def requests_per_sequence(self, next_n: int) -> int:
        """Requests one sequence hands the kernel: next_n under a flattened encoding, else 1."""
        return next_n if self.contract and self.contract.length_encoding in FLATTENED else 1

    def pool_blocks(self, block_size: int, head_dim: int, canaries: int) -> int | None:
        """The most blocks the sequences may use inside max_pool_bytes (the canaries counted); None: any."""
        if self.contract is None or self.contract.max_pool_bytes is None:
            return None
        return self.contract.max_pool_bytes // (block_size * (head_dim + 4)) - canaries


@st.composite
def _specs(draw: st.DrawFn, *, next_ns: tuple[int, ...], heads: tuple[int, ...], head_dims: tuple[int, ...],
           block_sizes: tuple[int, ...], fp8: tuple[Fp8Flavour, ...], max_batch: int, max_model_len: int,
           max_padding: int, max_extra_columns: int, values: tuple[Values, ...], name: str,
           envelope: _PagedEnvelope) -> CaseSpec:
    # next_n and the block size come first: the edge lengths are drawn around them.
    next_n = draw(_ascending(next_ns))
    block_size = draw(st.sampled_from(block_sizes))
    head_dim = draw(st.sampled_from(head_dims))
    per_sequence = envelope.requests_per_sequence(next_n)
    sequences = max(1, min(max_batch, envelope.max_requests // per_sequence))
    lengths = draw(st.lists(_lengths(next_n, block_size, max_model_len), min_size=1, max_size=sequences))
    padding = draw(st.integers(0, max(0, min(max_padding, envelope.max_requests // per_sequence - len(lengths)))))
    canaries = CaseSpec.canary_blocks
    room = envelope.pool_blocks(block_size, head_dim, canaries)
    if room is not None:
        lengths = _within_blocks(lengths, block_size, room)
    return CaseSpec(
        name=name, batch=len(lengths), next_n=next_n, block_size=block_size, lengths=tuple(lengths),
        heads=draw(st.sampled_from(heads)), head_dim=head_dim,
        max_model_len=max_model_len, padding=padding,
        shared_blocks=draw(st.booleans()), stale=draw(st.sampled_from(STALE_ORDER)),
        extra_columns=draw(st.integers(0, max_extra_columns)), values=draw(st.sampled_from(values)),
        fp8=draw(st.sampled_from(fp8))).validate()


def _ascending(values: tuple[int, ...]) -> st.SearchStrategy[int]:
    """One of ascending `values`, shrinking toward the first: an integer range where they are one (as a strategy
    with no contract has always drawn next_n), else a sample."""
    if values == tuple(range(values[0], values[-1] + 1)):
        return st.integers(values[0], values[-1])
    return st.sampled_from(values)


def _within_blocks(lengths: list[int], block_size: int, room: int) -> list[int]:
    """The lengths, each cut so that together they use at most `room` blocks (a contract's max_pool_bytes)."""
    cut = []
    for length in lengths:
        most = max(0, room) * block_size
        cut.append(min(length, most))
        room -= -(-cut[-1] // block_size)
    return cut


def _lengths(next_n: int, block_size: int, max_model_len: int) -> st.SearchStrategy[int]:
    """Any length, or one of the edges where these kernels broke before; both shrink toward 0."""
    edges = {0, 1, next_n - 1, next_n, next_n + 1, max_model_len - 1, max_model_len}
    edges |= {k * block_size + d for k in (1, 2) for d in (-1, 0, 1)}
    return st.integers(0, max_model_len) | st.sampled_from(sorted(e for e in edges if 0 <= e <= max_model_len))


def cases(*, device: str = "cpu", **spec_bounds: object) -> st.SearchStrategy[Case]:
    """A strategy for paged Cases: a spec drawn by `specs(device=device, **spec_bounds)` (a `contract` among them
    keeps every case inside it), then a seed, built by build_case.

    The case's meta holds the spec (as JSON) and the seed, so a failing example replays with
    `build_case(CaseSpec.from_json(case.meta["spec"]), case.meta["seed"])`. Shrinks as `specs`
    does, then toward seed 0.
    """
    if not isinstance(device, str):
        raise InvalidArgument(f"device={device!r} (type={type(device).__name__}) must be a str")
    structure = specs(device=device, **spec_bounds)  # type: ignore[arg-type]
    return st.tuples(structure, st.integers(0, MAX_SEED)).map(lambda pair: build_case(*pair, device=device))


paged_cases = cases  # the paged strategy under the name for_contract's table gives it


# --------------------------------------------------------------------------- top-k


def topk_specs(contract: TopkContract, *, device: str = "cpu", max_rows: int = 8, max_width: int = 256,
               max_k: int = 64, name: str = "hypothesis") -> st.SearchStrategy[TopkSpec]:
    """TopkSpecs a kernel of `contract` takes on `device`: k among its ks (else 1..max_k, up to its max_k), rows
    of width 1..max_width (at least k where it ranks whole rows; at most its max_width), 1..max_rows rows (at
    most its max_rows) in groups of next_n, a row stride its row_stride rule takes, windows its window form can
    say (decode-rule windows at its next_n values), then the values, ties and what lies outside the windows.
    Shrinks toward k 1 (or its first k), one narrow row, full windows, integer values and -inf outside."""
    _check_bound("max_rows", max_rows, 1)
    _check_bound("max_width", max_width, 1)
    _check_bound("max_k", max_k, 1)
    _check_device(device, contract.devices)
    if torch.float32 not in contract.dtypes:
        raise InvalidArgument(f"contract.dtypes={contract.dtypes!r}: the top-k cases are float32, which it excludes")
    rows = min(max_rows, contract.max_rows or max_rows)
    candidates = sorted(contract.ks) if contract.ks is not None else range(1, max_k + 1)
    ks = _allowed("max_k", candidates, lambda k: _narrowest_reason(contract, k) is None, contract)
    decode_rule = contract.window == WindowForm.DECODE_RULE
    groups = sorted(contract.next_n) if decode_rule and contract.next_n is not None else range(1, 5)
    next_ns = _allowed("max_rows", groups, lambda n: n <= rows, contract)
    return _topk_specs(contract=contract, ks=ks, max_width=max_width, max_rows=rows, next_ns=next_ns, name=name)


def _narrowest_reason(contract: TopkContract, k: int) -> str | None:
    """Why the contract takes no row of k's narrowest width (k where it ranks whole rows, else 1), or None."""
    width = k if contract.width_at_least_k else 1
    stride = -(-width // 4) * 4 if contract.row_stride == RowStride.MULTIPLE_OF_4 else width
    return contract.shape_reason(1, width, stride, k)


@st.composite
def _topk_specs(draw: st.DrawFn, *, contract: TopkContract, ks: tuple[int, ...], max_width: int, max_rows: int,
                next_ns: tuple[int, ...], name: str) -> TopkSpec:
    k = draw(st.sampled_from(ks))
    least = k if contract.width_at_least_k else 1
    width = draw(st.integers(least, max(least, min(max_width, contract.max_width or max_width))))
    windows = draw(st.sampled_from(TOPK_WINDOWS[contract.window]))
    next_n = draw(st.sampled_from(next_ns)) if windows == WindowDist.DECODE else 1
    rows = next_n * draw(st.integers(1, max(1, max_rows // next_n)))
    values = draw(st.sampled_from(TOPK_VALUES_ORDER))
    ties = (draw(st.integers(0, k)),) if values == TopkValues.TIED else (0,)
    return TopkSpec(name=name, rows=rows, width=width, k=k, row_stride=draw(_row_stride(contract.row_stride, width)),
                    windows=windows, next_n=next_n, values=values, ties=ties,
                    outside=draw(st.sampled_from(OUTSIDE_ORDER))).validate()


def _row_stride(rule: RowStride, width: int) -> st.SearchStrategy[int | None]:
    """A row stride the rule takes: contiguous rows (None) first, then 1..4 columns of padding (to a multiple of
    4 where the rule asks one)."""
    if rule == RowStride.EQUALS_WIDTH:
        return st.none()
    if rule == RowStride.MULTIPLE_OF_4:
        aligned = -(-width // 4) * 4
        return st.integers(0, 2).map(lambda extra: aligned + 4 * extra)
    return st.none() | st.integers(1, 4).map(lambda extra: width + extra)


def topk_cases(contract: TopkContract, *, device: str = "cpu", **bounds: Any) -> st.SearchStrategy[TopkCase]:
    """TopkCases of topk_specs(contract, device=device, **bounds) and a seed, built by build_topk_case (its meta
    the spec and the seed)."""
    structure = topk_specs(contract, device=device, **bounds)
    return st.tuples(structure, st.integers(0, MAX_SEED)).map(lambda pair: build_topk_case(*pair, device=device))


# --------------------------------------------------------------------------- ragged (prefill) logits


def ragged_specs(contract: RaggedContract, *, device: str = "cpu", max_rows: int = 8, max_keys: int = 96,
                 heads: Sequence[int] | None = None, head_dims: Sequence[int] | None = None,
                 name: str = "hypothesis") -> st.SearchStrategy[RaggedSpec]:
    """RaggedSpecs a kernel of `contract` takes on `device`: H and D it lists (or the given choices it takes,
    by default (1, 4, 16, 32) and (16, 32, 64)), 1..max_rows rows over 1..max_keys keys (at most its max_rows
    and max_keys), full, random or staircase windows (each row's window fits a window-relative row: the
    case's max_seqlen_k is its longest window), its fp8 flavour, the values family and canaries or not.
    Shrinks toward one row, few keys, full windows, the first listed H and D and integer values."""
    _check_bound("max_rows", max_rows, 1)
    _check_bound("max_keys", max_keys, 1)
    _check_device(device, contract.devices)
    heads = _allowed("heads", _given("heads", heads, (1, 4, 16, 32), _sorted(contract.heads),
                                     lambda h: isinstance(h, int) and h >= 1, "a positive int"),
                     lambda h: contract.shape_reason(1, 1, h, _first(contract.head_dims, 16)) is None, contract)
    head_dims = _allowed("head_dims", _given("head_dims", head_dims, (16, 32, 64), _sorted(contract.head_dims),
                                             lambda d: isinstance(d, int) and d >= 16 and d % 16 == 0,
                                             "a positive multiple of 16"),
                         lambda d: contract.shape_reason(1, 1, heads[0], d) is None, contract)
    return _ragged_specs(max_rows=min(max_rows, contract.max_rows or max_rows),
                         max_keys=min(max_keys, contract.max_keys or max_keys), heads=heads, head_dims=head_dims,
                         fp8=contract.fp8, name=name)


@st.composite
def _ragged_specs(draw: st.DrawFn, *, max_rows: int, max_keys: int, heads: tuple[int, ...],
                  head_dims: tuple[int, ...], fp8: Fp8Flavour, name: str) -> RaggedSpec:
    rows = draw(st.integers(1, max_rows))
    keys = draw(st.integers(1, max_keys))
    windows = draw(st.sampled_from(RAGGED_WINDOWS_ORDER if keys >= rows else RAGGED_WINDOWS_ORDER[:2]))
    requests = draw(st.integers(1, rows)) if windows == RaggedWindows.STAIRCASE else 1
    return RaggedSpec(name=name, rows=rows, keys=keys, heads=draw(st.sampled_from(heads)),
                      head_dim=draw(st.sampled_from(head_dims)), windows=windows, requests=requests,
                      values=draw(st.sampled_from(VALUES_ORDER)), fp8=fp8, canaries=draw(st.booleans())).validate()


def ragged_cases(contract: RaggedContract, *, device: str = "cpu", **bounds: Any) -> st.SearchStrategy[RaggedCase]:
    """RaggedCases of ragged_specs(contract, device=device, **bounds) and a seed, built by build_ragged_case."""
    structure = ragged_specs(contract, device=device, **bounds)
    return st.tuples(structure, st.integers(0, MAX_SEED)).map(lambda pair: build_ragged_case(*pair, device=device))


# --------------------------------------------------------------------------- any contract

CONTRACT_STRATEGIES: dict[type, Callable[..., st.SearchStrategy[Any]]] = {
    Contract: lambda contract, **bounds: paged_cases(contract=contract, **bounds),
    TopkContract: topk_cases, RaggedContract: ragged_cases}


def for_contract(contract: Contract | TopkContract | RaggedContract, **bounds: Any) -> st.SearchStrategy[Any]:
    """The cases of the strategy of `contract`'s operation (paged_cases, topk_cases or ragged_cases), every one
    inside the contract; `bounds` are that strategy's (device, max_rows, ...)."""
    strategy = CONTRACT_STRATEGIES.get(type(contract))
    if strategy is None:
        raise InvalidArgument(f"contract={contract!r} (type={type(contract).__name__}) must be one of "
                              f"{[t.__name__ for t in CONTRACT_STRATEGIES]}")
    return strategy(contract, **bounds)


# --------------------------------------------------------------------------- argument checks


def _given(field: str, given: Sequence[Any] | None, default: tuple[Any, ...], listed: tuple[Any, ...] | None,
           valid: Callable[[object], bool], what: str) -> tuple[Any, ...]:
    """The choices of `field`: those given (checked), else the contract's own list, else the default."""
    if given is None:
        return listed if listed is not None else default
    _check_choices(field, given, valid, what)
    return tuple(given)


def _allowed(field: str, choices: Sequence[int] | range, takes: Callable[[int], bool],
             contract: object) -> tuple[int, ...]:
    """The choices the contract takes, in order; InvalidArgument naming `field` when it takes none of them."""
    kept = tuple(c for c in choices if takes(c))
    if not kept:
        raise InvalidArgument(f"{field}: the contract takes none of {list(choices)} ({contract!r})")
    return kept


def _sorted(values: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return tuple(sorted(values)) if values is not None else None


def _first(values: tuple[int, ...] | None, default: int) -> int:
    return min(values) if values else default


def _check_device(device: object, devices: tuple[str, ...]) -> None:
    if not isinstance(device, str):
        raise InvalidArgument(f"device={device!r} (type={type(device).__name__}) must be a str")
    if device not in devices:
        raise InvalidArgument(f"device={device!r}: the contract declares devices {list(devices)}")


def _check_bound(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidArgument(f"{name}={value!r} (type={type(value).__name__}) must be an int >= {least}")


def _check_choices(name: str, choices: object, valid: Callable[[object], bool], what: str) -> None:
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) or not choices:
        raise InvalidArgument(f"{name}={choices!r} (type={type(choices).__name__}) must be a non-empty "
                              f"sequence of choices, simplest first")
    bad = [c for c in choices if isinstance(c, bool) or not valid(c)]
    if bad:
        raise InvalidArgument(f"{name}={choices!r}: {bad[0]!r} (type={type(bad[0]).__name__}) is not {what}")
