"""Which options of `difftest run` and `difftest fuzz` mean something for which operation (`--op`): one table,
OPTIONS, by each option's argparse destination, that the command line reads to refuse an option given to an
operation it means nothing for, in one line naming the option, its value and why (refused()).

Why here: the table speaks of --flags, the shells' words, which no library layer may speak (a library error
names a library parameter: difftest.core.errors), so it lives beside difftest/cli.py, not below it in
difftest/engine or difftest/workflows; and not inside cli.py, which is past the 700 lines a module may have
and would bury the table among the commands. A module of its own is what a reader (and the test that walks the
table, tests/difftest/test_cli_options.py) opens to learn what `--op topk --encoding per-row` does, and what
the pytest plugin, the other shell, may read too. It imports difftest.core alone: its layer lies just below
the shells' (pyproject.toml's import-linter contract).
"""

from __future__ import annotations

import argparse
import dataclasses

from difftest.core.errors import SpecError
from difftest.core.kinds import RELATIONS, OperationKind

EVERY = frozenset(OperationKind)
PAGED = frozenset({OperationKind.PAGED_LOGITS})
NEGATABLE = ("batching",)  # the --flag/--no-flag options: --no-flag (False) is given too, None is absent


@dataclasses.dataclass(frozen=True)
class Applies:
    """Where one option means something: the operations that read it, and for every other one why it does not
    (one line, read after 'not of --op X: ')."""

    ops: frozenset[OperationKind]
    why_not: str = ""


_EVERY = Applies(EVERY)
_SHAPE = Applies(PAGED, "it shapes paged cases (a CaseSpec field, or the paged fuzz regime's bound); the other "
                        "operations draw their cases from their own suites and envelopes (--cases)")
_REGIME = Applies(PAGED, "it bounds the paged fuzz regime's cases; the other operations draw random specs of their own")
_CACHE = Applies(PAGED, "length encodings and cache layouts are the paged KV cache's; --op topk is handed windows, "
                        "--op ragged-logits key windows, each in the form its contract declares")
_SPREAD = Applies(PAGED, "spreading a run over shards and GPUs is the paged session's; run --op X in one process "
                         "(its backends still run in workers under --isolate)")
_SANITIZER = Applies(PAGED, "the compute-sanitizer replay reruns a paged result's bundle in a fresh process; the other "
                            "operations' bundles replay with difftest replay BUNDLE")
_TIMING = Applies(PAGED, "timing (CUDA events, L2 flushed, siblings compared) is the paged runner's")

OPTIONS: dict[str, Applies] = {
    "op": _EVERY, "backends": _EVERY, "backend_module": _EVERY, "cases": _EVERY, "budget": _EVERY, "oracle": _EVERY,
    "count": _EVERY, "seed": _EVERY, "device": _EVERY, "report": _EVERY, "junit": _EVERY, "stream": _EVERY,
    "overwrite": _EVERY, "quiet": _EVERY, "verbose": _EVERY, "repro_dir": _EVERY, "case_filter": _EVERY,
    "isolate": _EVERY, "timeout": _EVERY, "startup_timeout": _EVERY, "repeat": _EVERY, "until_failures": _EVERY,
    "next_n": _SHAPE, "block_sizes": _SHAPE, "batch": _SHAPE, "max_model_len": _SHAPE, "heads": _SHAPE,
    "head_dim": _SHAPE,
    "spec": Applies(PAGED, "a CaseSpec is a paged case's; the other operations' cases come from their own suites "
                           "and envelopes (--cases, --case-filter)"),
    "max_batch": _REGIME, "max_context": _REGIME, "block_size": _REGIME,
    "encoding": _CACHE, "layout": _CACHE,
    "ledger": Applies(PAGED, "ledger entries name paged-logits divergences; a run of another operation keeps none"),
    "no_progress": Applies(PAGED, "the other operations' runs and campaigns draw no progress bar to turn off"),
    "time": _TIMING, "fail_slow": _TIMING,
    "resume": Applies(PAGED, "a run of another operation cannot be resumed: run it again (its stream keeps what "
                             "finished)"),
    "sanitize": _SANITIZER, "sanitize_all": _SANITIZER,
    "shard": _SPREAD, "gpus": _SPREAD, "jobs": _SPREAD,
    "metamorphic": Applies(frozenset(RELATIONS), "it has no metamorphic relations"),
    "shrink_seconds": Applies(PAGED, "the campaigns of the other operations bundle their failures without "
                                     "shrinking them (difftest shrink BUNDLE shrinks one)"),
    "graph": Applies(PAGED, "graph replay captures a paged backend's per-layer call and rewrites its paged "
                            "buffers in place; the other operations' cases are not replayed that way yet"),
    "batching": Applies(PAGED, "batches are paged cases of one shape in one launch; the other operations launch "
                               "each case alone"),
}


def given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the option of destination `dest` was given: absent is None, [] or (), or False for a plain --flag
    (a --flag/--no-flag option, NEGATABLE, is None unless given)."""
    value = getattr(args, dest, None)
    return value not in (None, [], ()) and (value is not False or dest in NEGATABLE)


def refused(args: argparse.Namespace) -> None:
    """SpecError naming the first option given (the table's order) that means nothing for args.op, its value and
    why: '--encoding='per-row': expected an option of --op paged-logits only, not of --op topk: length ...'."""
    for dest, applies in OPTIONS.items():
        if args.op in applies.ops or not given(args, dest):
            continue
        value = getattr(args, dest)
        shown = (",".join(getattr(v, "value", str(v)) for v in value) if isinstance(value, (list, tuple))
                 else getattr(value, "value", value))  # an enum as the word given
        flag = ("--no-" if value is False else "--") + dest.replace("_", "-")
        taking = sorted(op.value for op in applies.ops)
        listed = f"{taking[0]} only" if len(taking) == 1 else f"{', '.join(taking[:-1])} or {taking[-1]}"
        raise SpecError(flag, shown, f"an option of --op {listed}, not of --op {args.op.value}: {applies.why_not}")
