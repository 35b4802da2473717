"""An operation: one stage of the indexer made testable, as data the engine is handed.

The engine (planner, runner, bundles, replay, shrink, fuzz, reports) is written against this dataclass, never
against a stage: each operation's pieces live in the layer they belong to (its case and contract in core, its
generators and shrink moves in generators, its oracle in oracles, its comparison in engine) and
difftest/operations ties them into one Operation per stage and keeps the registry (name -> Operation).
docs/writing-an-operation.md walks through adding one.

The functions take and return the operation's own types (its case, spec, contract, reference, output); the
engine passes them along without looking inside, which is why they are typed `Any` here. Where the engine
guards a call (difftest.engine.guards.GuardedCall: the output contract, mutated inputs, poison, repeats), the
operation declares its piece: the output it expects (Expected), how launches agree (stability) and which
backends a call reaches (watched).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from difftest.core.kinds import Headline, OperationKind


@dataclasses.dataclass(frozen=True)
class Planned:
    """One case an operation's envelope plan draws for a backend: its spec and the edge families it covers."""

    spec: Any
    families: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Expected:
    """One tensor a backend's output must be on one case, as its contract declares it: the output itself
    (`part` None), or the attribute `part` of it (a composition's Staged: .logits, .indices)."""

    what: str  # what the report calls it: 'indices', 'logits'
    dtypes: tuple[Any, ...]  # torch dtypes it may have
    shape: tuple[int, ...]
    device: str  # the device type it must be on: 'cpu', 'cuda'
    part: str | None = None

    def describe(self) -> str:
        """'indices: a dense torch.Tensor of shape [4, 8], dtype torch.int32 or torch.int64, on cpu'."""
        dtypes = " or ".join(map(str, self.dtypes))
        return f"{self.what}: a dense torch.Tensor of shape {list(self.shape)}, dtype {dtypes}, on {self.device}"


@dataclasses.dataclass(frozen=True)
class Operation:
    """Everything that makes one indexer stage testable (the fields' docs say what each is handed)."""

    kind: OperationKind
    summary: str  # one line for `difftest backends`
    headlines: tuple[Headline, ...]  # the numbers the report table leads with
    case_type: type  # the case: .name, .rows, .describe(), .validate(), .to(device), .save(path)
    spec_type: type  # the spec a case is drawn from: .name, .to_json(), .from_json(dict) -> spec
    contract_type: type  # a backend's declared conventions: .accepts(case, device) -> reason | None, .library
    # name -> zero-argument factory of every built-in backend of this operation
    backends: Callable[[], dict[str, Callable[[], Any]]]
    # generators: the fixed suite (seed, count) -> specs; the envelope plan of one contract on a device
    suite: Callable[[], list[Any]]
    envelope: Callable[[Any, str], list[Planned]]
    # (a random.Random, device) -> a spec the fuzzer draws; None: the operation's own campaign draws them
    # (paged logits: difftest.workflows.fuzz, which walks the envelope with fresh seeds)
    random_spec: Callable[[Any, str], Any] | None
    build: Callable[[Any, int, str], Any]  # (spec, seed, device) -> case
    case_name: Callable[[Any, int], str]  # (spec, seed) -> the name build gives its case
    load_case: Callable[[Path], Any]  # a case written by case.save
    # oracle: (case, contract, OracleKind) -> the reference judge reads
    reference: Callable[[Any, Any, Any], Any]
    # the calling convention: (backend, case) -> its output, the case encoded as the backend's contract declares
    call: Callable[[Any, Any], Any]
    # comparison: (reference, output, case, contract) -> difftest.engine.result.Judgement
    judge: Callable[[Any, Any, Any, Any], Any]
    # shrink moves: (case, still_fails(case) -> bool, contract, seconds) -> the smallest failing case found;
    # None: the operation's own shrinker (paged logits: difftest.workflows.shrink, probing in a worker)
    shrink: Callable[[Any, Callable[[Any], bool], Any, float], Any] | None
    # metamorphic relations (difftest.core.kinds.RELATIONS, RunConfig.metamorphic), checked on each result that
    # ran, after judging: (case, output, contract, relations, launch) -> the violations, launch(case) calling the
    # backend on a related case where it runs (difftest.engine.operation_run); None: no relations here
    relate: Callable[[Any, Any, Any, Any, Callable[[Any], Any]], tuple[Any, ...]] | None
    # the output contract: (case, contract) -> the Expected tensors of a backend's output on the case; an output
    # that is not them is ERROR (difftest.engine.guards.output_violation), never handed to judge
    output: Callable[[Any, Any], tuple[Expected, ...]]
    # repeats (RunConfig.repeat): (reference, outputs of the launches, case, contract) ->
    # difftest.engine.stability.Stability, how the launches agreed; unstable is FAIL(nondeterministic)
    stability: Callable[[Any, tuple[Any, ...], Any, Any], Any]
    # the backends a call reaches: (backend, watch) -> the backend with watch(b, writes=()) put around each
    # backend the call hands inputs (a composition's stages), `writes` naming the inputs b's contract lets it
    # write into; each watched backend's inputs are checksummed and its fresh tensors poisoned
    watched: Callable[[Any, Callable[..., Any]], Any]

    @property
    def name(self) -> str:
        """The operation's name on the command line ('ragged-logits')."""
        return self.kind.value
