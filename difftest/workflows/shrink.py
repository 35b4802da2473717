"""Shrink a failing case: deterministic, time-bounded delta reduction, no hypothesis database.

A probe rebuilds a smaller candidate, runs the oracle and the backend (runner.run_one) and
keeps the candidate only when the backend still fails the same way: the same verdict (and, for an
ERROR, the same exception type; for a FAIL(metamorphic), the same relation still violated, each probe
checking that relation alone). The backend runs where the config runs it: in one worker process for
the whole shrink under isolation (RunConfig.isolated; a probe that crashes costs only the worker, which
the next probe replaces, so a CRASH shrinks too), else in this process. A case that carries its spec
and seed (every generated case and every bundle written from one) is reduced on the spec, each probe
rebuilt with build_case; a case without one (a golden file) is reduced on its tensors by slicing.
Each round tries, in this order:

1. drop sequences: halves, then quarters, ..., then single sequences;
2. shorten each length: small lengths (0, 1, .., next_n + 1) and lengths of the same residue
   modulo the block size, smallest first, then a binary search toward 0;
3. lower next_n, keeping a window of consecutive draft rows with their causal limits;
4. lower H to a small divisor the contract accepts, then D;
5. simplify the rest: padding, extra table columns, shared blocks, stale kind, values family,
   fp8 flavour, seed 0, max_model_len toward the longest length (on tensors: trim table columns,
   drop unreferenced pool blocks).

Rounds repeat until one changes nothing or the budget is spent.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Protocol

import torch

from difftest.backends import Backend, as_loaded
from difftest.core.case import Case, select_sequences
from difftest.core.errors import SpecError, require
from difftest.core.kinds import AnyRelation, Fp8Flavour
from difftest.core.spec import CaseSpec, Stale, Values, case_name
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.isolate import Executor
from difftest.engine.result import CaseResult
from difftest.engine.runner import executors_for
from difftest.generators.tensors import build_case
from difftest.records.bundle import Bundle
from difftest.records.commands import run_command
from difftest.workflows.running import run_one

# Lengths of the same residue modulo the block size tried before the binary search (per length).
RESIDUE_CANDIDATES = 8


@dataclasses.dataclass(frozen=True)
class Failure:
    """How a backend fails: what 'the same way' compares."""

    verdict: Verdict
    error_type: str | None = None  # the exception class of an ERROR
    relation: AnyRelation | None = None  # the first metamorphic relation a FAIL(metamorphic) violated

    @classmethod
    def of(cls, result: CaseResult) -> Failure | None:
        """The failure `result` shows, or None when it passed or was skipped."""
        if not result.verdict.failed:
            return None
        error = result.error_type if result.verdict == Verdict.ERROR else None
        violated = result.metamorphic[0].relation if result.verdict == Verdict.FAIL_METAMORPHIC else None
        return cls(result.verdict, error, violated)

    def matches(self, result: CaseResult) -> bool:
        """Whether `result` fails this way: the same verdict (and exception type); for a FAIL(metamorphic), the
        same relation still violated."""
        found = Failure.of(result)
        if found is None or (found.verdict, found.error_type) != (self.verdict, self.error_type):
            return False
        return self.relation is None or self.relation in {v.relation for v in result.metamorphic}


@dataclasses.dataclass(frozen=True)
class ShrinkResult:
    """The smallest case found that fails the way the original did."""

    original: Case
    case: Case
    result: CaseResult  # the backend on `case`
    spec: CaseSpec | None  # None when the case was reduced on its tensors
    seed: int | None
    probes: int  # backend runs, the original's included
    seconds: float
    finished: bool  # False when the budget ran out before a round changed nothing

    def summary(self, target: str, config: RunConfig) -> str:
        """Before and after, the verdict kept, the cost; last the line that runs the shrunk case again
        (ShrinkResult.command)."""
        spent = "" if self.finished else ", budget spent"
        return "\n".join([f"before: {self.original.describe()} rows={self.original.rows}",
                          f"after:  {self.case.name}: {self.case.describe()} rows={self.case.rows}",
                          f"verdict: {self.result.verdict.value} kept ({self.probes} probes, "
                          f"{self.seconds:.1f} s{spent})", self.command(target, config)])

    def line(self) -> str:
        """The shrunk case in one line: {"seed": .., "spec": {..}} JSON, or the case's description."""
        if self.spec is None:
            return self.case.describe()
        return json.dumps({"seed": self.seed, "spec": self.spec.to_json()}, separators=(",", ":"))

    def command(self, target: str, config: RunConfig) -> str:
        """The `difftest run` command line that runs the shrunk case through backend `target` (a
        registered name or 'package.module:object') as `config` fed it; the case's description when
        it was shrunk on its tensors (no spec to draw it from)."""
        if self.spec is None or self.seed is None:
            return self.case.describe()
        return run_command(target, self.spec, self.seed, config)


def case_from_line(line: str, device: str | torch.device = "cpu") -> Case:
    """The case a spec line of ShrinkResult.line() describes, built on `device`."""
    data = json.loads(line)
    return build_case(CaseSpec.from_json(data["spec"]), int(data["seed"]), device)


def require_shrink_seconds(budget_seconds: float) -> None:
    """SpecError naming budget_seconds unless it is a shrink's budget: a finite number of seconds >= 0 (every
    operation's shrink checks it so)."""
    require(0 <= budget_seconds < math.inf, "budget_seconds", budget_seconds,
            "a finite number of seconds >= 0 (0: the original case, after the one probe that confirms it)")


def shrink(target: Bundle | Case, backend: Backend, config: RunConfig | None = None,
           budget_seconds: float = 30.0) -> ShrinkResult:
    """Reduce a failing bundle's (or case's) case for `backend` within about `budget_seconds`.

    `config` defaults to the bundle's recorded one (RunConfig() for a bare case); under its isolation
    every probe runs in one worker process (replaced after a crash), the start-up counted in the budget.
    SpecError when the case does not fail on `backend` now.
    """
    require_shrink_seconds(budget_seconds)
    start = time.perf_counter()
    original = target.case if isinstance(target, Bundle) else target
    config = config or (target.config if isinstance(target, Bundle) else RunConfig())
    loaded = as_loaded(backend)
    with executors_for([loaded], config) as (executor,):
        first = run_one(loaded, original, config, executor)
        failure = Failure.of(first)
        if failure is None:
            raise SpecError("case", original.name, f"a case {backend.name} fails on; it gives {first.verdict.value}")
        # Each probe checks the one relation a FAIL(metamorphic) must still violate, and none for other failures:
        # the oracle's verdict ranks above a violation, so relations cannot change whether they fail alike.
        config = dataclasses.replace(config, metamorphic=(failure.relation,) if failure.relation else ())
        search = _Search(loaded, executor, config, failure, _moves_for(original, config.device),
                         start + budget_seconds, original, first)
        finished = search.run()
    spec, seed = (search.state.spec, search.state.seed) if isinstance(search.state, _SpecState) else (None, None)
    if spec is not None:  # named as `run --spec` names it: the spec's name says it is the shrunk one
        spec = spec.replace(name=f"{spec.name}-min")
    name = case_name(spec, seed) if spec is not None and seed is not None else f"{original.name}-min"
    case = dataclasses.replace(search.case, name=name)
    return ShrinkResult(original=original, case=case, result=_renamed(search.result, search.case.name, case.name),
                        spec=spec, seed=seed, probes=search.probes, seconds=time.perf_counter() - start,
                        finished=finished)


def _renamed(result: CaseResult, old: str, new: str) -> CaseResult:
    """`result` of the case once named `old`, now `new`: its violations' related cases renamed with it."""
    violations = tuple(dataclasses.replace(v, related=tuple(new + name.removeprefix(old) for name in v.related))
                       for v in result.metamorphic)
    return dataclasses.replace(result, case=new, metamorphic=violations)


def compact_pool(case: Case) -> Case:
    """The case with only the pool blocks its table references (stale entries included), renumbered."""
    table = case.block_table.to(torch.int64)
    in_pool = (table >= 0) & (table < case.k_pool.shape[0])
    kept = torch.unique(table[in_pool])  # (K,) old ids, ascending
    renumber = torch.full((case.k_pool.shape[0],), -1, dtype=torch.int64, device=case.device)
    renumber[kept] = torch.arange(kept.numel(), device=case.device)
    # Ids outside the old pool stay outside the new one: shifted past its end by the same amount.
    outside = torch.where(table < 0, table, table - case.k_pool.shape[0] + kept.numel())
    table = torch.where(in_pool, renumber[table.clamp(0, case.k_pool.shape[0] - 1)], outside)
    return dataclasses.replace(case, k_pool=case.k_pool[kept], scale_pool=case.scale_pool[kept],
                               block_table=table.to(case.block_table.dtype))


# --------------------------------------------------------------------------- states and moves

@dataclasses.dataclass(frozen=True)
class _SpecState:
    spec: CaseSpec
    seed: int


@dataclasses.dataclass(frozen=True)
class _TensorState:
    """A recipe applied to the original case: which sequences, draft rows, heads, dims, width."""

    sequences: tuple[int, ...]
    lengths: tuple[int, ...]
    start: int  # first draft row kept
    next_n: int
    heads: int
    head_dim: int
    max_model_len: int
    columns: int
    compact: bool = False


class _Moves(Protocol):
    """The edits one representation of a case allows; states are hashable so probes are cached."""

    initial: Hashable
    block_size: int

    def get(self, state: Any, field: str) -> Any: ...

    def put(self, state: Any, **changes: Any) -> Any: ...

    def drop(self, state: Any, indices: range) -> Any: ...

    def window(self, state: Any, start: int, count: int) -> Any: ...

    def simplifications(self, state: Any) -> list[tuple[str, list[Any]]]: ...

    def build(self, state: Any) -> Case: ...


def _moves_for(case: Case, device: str) -> _Moves:
    meta = case.meta
    if "spec" in meta and "seed" in meta:
        spec = CaseSpec.from_json(meta["spec"])
        real = case.batch - spec.padding
        lengths = tuple(case.seq_lens[:real].tolist())
        return _SpecMoves(_SpecState(spec.replace(lengths=lengths, batch=real), int(meta["seed"])), device)
    return _TensorMoves(case)


def _windowed(lengths: Sequence[int], next_n: int, start: int, count: int) -> tuple[int, ...]:
    """Lengths that give draft rows [start, start + count) of next_n their limits with count rows."""
    return tuple(max(n - (next_n - start - count), 0) for n in lengths)


class _SpecMoves:
    """Edits of (spec, seed); every probe is rebuilt with build_case on the run's device."""

    def __init__(self, initial: _SpecState, device: str) -> None:
        self.initial, self.device, self.block_size = initial, device, initial.spec.block_size

    def get(self, state: _SpecState, field: str) -> Any:
        return state.seed if field == "seed" else getattr(state.spec, field)

    def put(self, state: _SpecState, **changes: Any) -> _SpecState:
        seed = changes.pop("seed", state.seed)
        if "lengths" in changes:
            changes["batch"] = len(changes["lengths"])
        return _SpecState(state.spec.replace(**changes), seed)

    def drop(self, state: _SpecState, indices: range) -> _SpecState:
        lengths = state.spec.lengths or ()
        return self.put(state, lengths=tuple(n for i, n in enumerate(lengths) if i not in indices))

    def window(self, state: _SpecState, start: int, count: int) -> _SpecState:
        return self.put(state, next_n=count, lengths=_windowed(state.spec.lengths or (), state.spec.next_n,
                                                               start, count))

    def simplifications(self, state: _SpecState) -> list[tuple[str, list[Any]]]:
        spec = state.spec
        return [("padding", list(range(spec.padding))), ("extra_columns", list(range(spec.extra_columns))),
                ("shared_blocks", [False] if spec.shared_blocks else []),
                ("stale", _before(spec.stale, (Stale.CANARY, Stale.ZERO, Stale.OTHER))),
                ("values", _before(spec.values, (Values.INTEGER, Values.NORMAL, Values.HEAVY))),
                ("fp8", _before(spec.fp8, (Fp8Flavour.E4M3FN, Fp8Flavour.E4M3FNUZ))),
                ("seed", [0] if state.seed else [])]

    def build(self, state: _SpecState) -> Case:
        return build_case(state.spec, state.seed, self.device)


class _TensorMoves:
    """Edits of a case without a spec: slices of the original tensors, never new values."""

    def __init__(self, original: Case) -> None:
        self.original, self.block_size = original, original.block_size
        self.initial = _TensorState(
            sequences=tuple(range(original.batch)), lengths=tuple(original.seq_lens.tolist()), start=0,
            next_n=original.next_n, heads=original.heads, head_dim=original.head_dim,
            max_model_len=original.max_model_len, columns=original.block_table.shape[1])

    def get(self, state: _TensorState, field: str) -> Any:
        return getattr(state, field)

    def put(self, state: _TensorState, **changes: Any) -> _TensorState:
        return dataclasses.replace(state, **changes)

    def drop(self, state: _TensorState, indices: range) -> _TensorState:
        keep = [i for i in range(len(state.sequences)) if i not in indices]
        return self.put(state, sequences=tuple(state.sequences[i] for i in keep),
                        lengths=tuple(state.lengths[i] for i in keep))

    def window(self, state: _TensorState, start: int, count: int) -> _TensorState:
        return self.put(state, start=state.start + start, next_n=count,
                        lengths=_windowed(state.lengths, state.next_n, start, count))

    def simplifications(self, state: _TensorState) -> list[tuple[str, list[Any]]]:
        used = -(-max(state.lengths) // self.block_size)
        return [("columns", list(range(max(used, 1), state.columns))), ("compact", [] if state.compact else [True])]

    def build(self, state: _TensorState) -> Case:
        case = select_sequences(self.original, state.sequences)
        rows = slice(state.start, state.start + state.next_n)
        heads, dims = slice(0, state.heads), slice(0, state.head_dim)
        weights = case.weights.reshape(case.batch, case.next_n, case.heads)[:, rows, heads]
        case = dataclasses.replace(
            case, q=case.q[:, rows, heads, dims].contiguous(), weights=weights.reshape(-1, state.heads).contiguous(),
            k_pool=case.k_pool[..., dims].contiguous(), block_table=case.block_table[:, : state.columns].contiguous(),
            seq_lens=torch.tensor(state.lengths, dtype=torch.int64, device=case.device),
            max_model_len=state.max_model_len, meta={k: v for k, v in case.meta.items() if k not in ("spec", "seed")})
        return (compact_pool(case) if state.compact else case).validate()


def _before(current: Any, order: Sequence[Any]) -> list[Any]:
    """The choices simpler than `current` in `order` (simplest first)."""
    return list(order[: order.index(current)])


# --------------------------------------------------------------------------- the search

class _OutOfTime(Exception):
    """The budget is spent: the search stops with the smallest failing case found so far."""


class _Search:
    """The current smallest failing state, and `attempt`, which probes a candidate and keeps it if it fails alike."""

    def __init__(self, backend: Backend, executor: Executor, config: RunConfig, failure: Failure, moves: _Moves,
                 deadline: float, case: Case, result: CaseResult) -> None:
        self.backend, self.executor, self.config = backend, executor, config
        self.failure, self.moves, self.deadline = failure, moves, deadline
        self.state: Any = None  # None until the initial state is confirmed: the original case stands
        self.case, self.result = case, result
        self.probes, self.accepted = 1, 0
        self.seen: dict[Hashable, bool] = {}

    def attempt(self, state: Hashable) -> bool:
        """Probe `state`; make it current when the backend fails on it the same way."""
        if state in self.seen:
            return False  # a state that failed alike is already current or was left for a smaller one
        if time.perf_counter() >= self.deadline:
            raise _OutOfTime
        self.probes += 1
        try:
            case = self.moves.build(state)
        except SpecError:
            self.seen[state] = False
            return False
        result = run_one(self.backend, case, self.config, self.executor)
        self.seen[state] = same = self.failure.matches(result)
        if same:
            self.state, self.case, self.result, self.accepted = state, case, result, self.accepted + 1
        return same

    def run(self) -> bool:
        """Rounds of every step until one changes nothing (True) or time runs out (False)."""
        try:
            if not self.attempt(self.moves.initial):
                # The spec does not rebuild a case that fails alike: reduce the tensors instead.
                self.moves = _TensorMoves(self.case)
                self.seen[self.moves.initial] = True
                self.state = self.moves.initial
            while True:
                before = self.accepted
                for step in (_drop_sequences, _shorten_lengths, _lower_next_n, _narrow, _simplify):
                    step(self)
                if self.accepted == before:
                    return True
        except _OutOfTime:
            return False


def _toward(search: _Search, options: Iterable[Any], edit: Callable[[Any, Any], Any]) -> bool:
    """Try `edit(state, option)` for each option in order; stop at the first that fails alike."""
    return any(search.attempt(edit(search.state, option)) for option in options)


def _drop_sequences(search: _Search) -> None:
    """ddmin over sequences: remove halves, then quarters, ..., then single sequences."""
    size = len(search.moves.get(search.state, "lengths")) // 2
    while size >= 1:
        start = 0
        while start < len(search.moves.get(search.state, "lengths")):
            count = len(search.moves.get(search.state, "lengths"))
            chunk = range(start, min(start + size, count))
            if count > len(chunk) and search.attempt(search.moves.drop(search.state, chunk)):
                continue  # the next chunk moved into this position
            start += size
        size //= 2


def _shorten_lengths(search: _Search) -> None:
    moves = search.moves
    for b in range(len(moves.get(search.state, "lengths"))):
        length = moves.get(search.state, "lengths")[b]
        next_n, block = moves.get(search.state, "next_n"), moves.block_size
        small = range(min(length, next_n + 2))
        residues = range(length % block, length, block)[:RESIDUE_CANDIDATES]
        _lower_length(search, b, length, [*small, *residues])


def _lower_length(search: _Search, b: int, length: int, candidates: list[int]) -> None:
    """Sequence b's length: the smallest failing candidate, then a binary search toward 0."""
    def edit(state: Any, value: int) -> Any:
        lengths = list(search.moves.get(state, "lengths"))
        lengths[b] = value
        return search.moves.put(state, lengths=tuple(lengths))

    _toward(search, sorted({c for c in candidates if c < length}), edit)
    _lower_range(search, 0, search.moves.get(search.state, "lengths")[b], edit)


def _lower_next_n(search: _Search) -> None:
    """Fewer draft rows: the smallest next_n first, the window of rows ending at the last one first."""
    next_n = search.moves.get(search.state, "next_n")
    allowed = search.backend.contract.next_n
    for count in (m for m in range(1, next_n) if allowed is None or m in allowed):
        starts = range(next_n - count, -1, -1)
        if _toward(search, starts, lambda state, s, c=count: search.moves.window(state, s, c)):
            return


def _narrow(search: _Search) -> None:
    """H to its smallest divisor the contract accepts, then D to the smallest accepted multiple of 16."""
    contract = search.backend.contract
    heads, dim = search.moves.get(search.state, "heads"), search.moves.get(search.state, "head_dim")
    divisors = [h for h in range(1, heads) if heads % h == 0 and h % contract.heads_multiple_of == 0]
    _toward(search, divisors, lambda state, h: search.moves.put(state, heads=h))
    dims = [d for d in range(16, dim, 16) if contract.head_dims is None or d in contract.head_dims]
    _toward(search, dims, lambda state, d: search.moves.put(state, head_dim=d))


def _simplify(search: _Search) -> None:
    """Each simplification toward its simplest option, then max_model_len toward the longest length."""
    for field, options in search.moves.simplifications(search.state):
        _toward(search, options, lambda state, value, f=field: search.moves.put(state, **{f: value}))
    longest = max(max(search.moves.get(search.state, "lengths")), 1)
    top = search.moves.get(search.state, "max_model_len")
    _lower_range(search, longest, top, lambda state, n: search.moves.put(state, max_model_len=n))


def _lower_range(search: _Search, floor: int, current: int, edit: Callable[[Any, int], Any]) -> None:
    """Binary search for the smallest value in [floor, current] that fails alike (current does)."""
    low, high = floor - 1, current
    while high - low > 1:
        middle = (low + high) // 2
        if search.attempt(edit(search.state, middle)):
            high = middle
        else:
            low = middle
