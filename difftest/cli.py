"""`difftest run`, `backends`, `replay` and `shrink`: parse the options, call the library, print.

Nothing heavy is imported until a command runs, so `difftest --help` costs no torch import. The
library's errors name its parameters; FLAGS maps them to the options that set them.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from difftest import __version__
from difftest.errors import Interrupted, OutputError, SpecError
from difftest.kinds import CacheLayout, CaseKind, Device, ExitStatus, LengthEncoding, OracleKind, SanitizerTool

if TYPE_CHECKING:
    from difftest.result import CaseResult
    from difftest.session import RunOutcome, RunRequest

# library parameter -> the option that sets it
FLAGS = {"backends": "--backends", "cases": "--cases", "count": "--count", "seed": "--seed", "next_n": "--next-n",
         "block_sizes": "--block-sizes", "batch": "--batch", "max_model_len": "--max-model-len", "heads": "--heads",
         "head_dim": "--head-dim", "case_filter": "--case-filter", "shard": "--shard", "gpus": "--gpus",
         "device": "--device", "encoding": "--encoding", "layout": "--layout", "isolate": "--isolate",
         "timeout": "--timeout", "repeat": "--repeat", "sanitize": "--sanitize", "sanitize_all": "--sanitize-all",
         "resume": "--resume", "stream": "--stream", "report": "--report", "backend": "--backends",
         "trust": "--trust-bundle", "budget": "--budget", "oracle": "--oracle",
         "spec": "--spec", "until_failures": "--until-failures", "shrink_seconds": "--shrink-seconds",
         "overwrite": "--overwrite",
         "startup_timeout": "--startup-timeout", "repro_dir": "--repro-dir"}


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, like every other difftest error, and exit 2."""

    def error(self, message: str) -> NoReturn:
        # "argument --x: 'v': expected ..." (the value types below) reads as every other error: --x='v': expected ...
        found = re.fullmatch(r"argument (\S+?)(?:/\S+)?: ('.*'): (expected .*)", message)
        if found:
            message = f"{found.group(1)}={found.group(2)}: {found.group(3)}"
        self.exit(ExitStatus.USAGE, f"difftest: error: {message} (see {self.prog} --help)\n")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _enum(kind: type[enum.Enum]) -> Callable[[str], enum.Enum]:
    """An argparse type for `kind`: its member of a value, or one line naming the values allowed."""

    def member(text: str) -> enum.Enum:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected one of {[m.value for m in kind]}") from None

    member.__name__ = kind.__name__
    return member


def _add_run(commands: argparse._SubParsersAction) -> None:
    # No abbreviated options: a --gpus run hands its command line to its children less a few options.
    run = commands.add_parser("run", help="run cases through backends and compare with the oracle", allow_abbrev=False)
    run.add_argument("--backends", type=_names, help="comma-separated registered names or package.module:object "
                     "paths (default: every registered backend)")
    run.add_argument("--backend-module", action="append", default=[], metavar="PKG.MOD:OBJ",
                     help="a user backend: a Backend, a factory, or a difftest.backend-decorated function (repeatable)")
    run.add_argument("--cases", type=_enum(CaseKind), default=CaseKind.ENVELOPE,
                     help="envelope: cases inside each backend's declared envelope at this device's scale "
                          "(production shapes on a GPU, small ones on the CPU); random, edges or all: the fixed "
                          "toy-shape suite (default: envelope)")
    run.add_argument("--budget", type=float, metavar="SECONDS",
                     help="start no case after this many seconds; the report lists those not started")
    run.add_argument("--oracle", type=_enum(OracleKind),
                     help="exact (float64 torch) or fast (the fused Triton oracle) (default: fast on cuda, "
                          "exact on cpu)")
    run.add_argument("--count", type=int, help="seeds per random spec (default: 1 for envelope suites, 6 for "
                     "random and all; 1 with --spec)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--next-n", type=_int_list, help="e.g. 1,2,4: one copy of every spec per value")
    run.add_argument("--block-sizes", type=_int_list, help="e.g. 1,64: one copy of every spec per value")
    run.add_argument("--batch", type=int, help="B of the random specs")
    run.add_argument("--max-model-len", type=int, help="max_model_len of the random specs")
    run.add_argument("--heads", type=int, help="H of the random specs")
    run.add_argument("--head-dim", type=int, help="D of the random specs")
    run.add_argument("--spec", metavar="JSON", help="one CaseSpec as JSON (fields not given keep their defaults) "
                     "instead of the suite: --count cases from --seed on")
    run.add_argument("--encoding", type=_enum(LengthEncoding),
                     help="what-if: hand every backend this length encoding instead")
    run.add_argument("--layout", type=_enum(CacheLayout),
                     help="what-if: hand every backend this cache layout instead")
    run.add_argument("--device", type=_enum(Device), default=Device.CPU, help="cpu or cuda (default: cpu)")
    run.add_argument("--report", type=Path, metavar="PATH", help="write the JSON report here")
    run.add_argument("--overwrite", action="store_true",
                     help="replace the report and stream an earlier run left at those paths (refused otherwise, "
                          "unless --resume)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    run.add_argument("--repro-dir", type=Path, metavar="DIR", help="write a reproducer bundle here for every failure")
    run.add_argument("--case-filter", action="append", default=[], metavar="GLOB",
                     help="run only the cases whose name matches (fnmatch, e.g. 'length-one-*'); repeatable")
    run.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                     help="run each backend in a worker process of its own, so a crash or a hang costs only "
                          "its verdict (CRASH, TIMEOUT) (default: on for cuda or with --timeout, off for cpu)")
    run.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="seconds one case (all its --repeat launches) may take in a worker before it is "
                          "killed: TIMEOUT (needs isolation; default 600)")
    run.add_argument("--startup-timeout", type=float, default=600.0, metavar="SECONDS",
                     help="seconds a worker may take to import and build its backend before it is killed: "
                          "TIMEOUT (default 600)")
    run.add_argument("--repeat", type=int, default=1, metavar="K",
                     help="launch each backend K times per case: bitwise-stable, stable within tolerance, "
                          "or unstable = FAIL(nondeterministic) (default: 1)")
    run.add_argument("--stream", type=Path, metavar="PATH.jsonl",
                     help="append each result to this JSONL file the moment it is made, so a killed run "
                          "keeps its results (default: the --report path with suffix .jsonl)")
    run.add_argument("--resume", type=Path, metavar="REPORT",
                     help="a JSON report or JSONL stream of an earlier run of the same cases: its (backend, "
                          "case) results are kept and only the missing pairs run")
    run.add_argument("--sanitize", type=_enum(SanitizerTool),
                     help="replay each failing result under NVIDIA compute-sanitizer in a fresh process and "
                          "attach its findings (cuda)")
    run.add_argument("--sanitize-all", action="store_true",
                     help="with --sanitize: replay every result that ran, passing ones too")
    run.add_argument("--shard", metavar="I/N",
                     help="run only the planned cases (after --case-filter) whose index in the plan is I mod N")
    run.add_argument("--gpus", type=int, metavar="N",
                     help="spread the cases over N child processes, one GPU each (shard I of N on entry I of "
                          "CUDA_VISIBLE_DEVICES, else on GPU I), merged in plan order into one table, --report and "
                          "--stream (written when the children end); --device cuda only; not with --resume or --shard")


def _duration(text: str) -> float:
    """Seconds of '90', '90s', '10m' or '1h'."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        return float(number) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 90, 90s, 10m or 1h") from None


def _add_fuzz(commands: argparse._SubParsersAction) -> None:
    fuzz = commands.add_parser("fuzz", help="a time-budgeted campaign: envelope cases with fresh seeds until the "
                               "budget, distinct failures bundled and shrunk", allow_abbrev=False)
    fuzz.add_argument("--budget", type=_duration, required=True, help="how long to draw cases: 90s, 10m, 1h")
    fuzz.add_argument("--until-failures", type=int, metavar="N", help="stop at N distinct failure signatures")
    fuzz.add_argument("--backends", type=_names, help="registered names or package.module:object paths "
                      "(default: every registered backend)")
    fuzz.add_argument("--device", type=_enum(Device), default=Device.CPU)
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                      help="workers per backend (default: on for cuda, off for cpu)")
    fuzz.add_argument("--oracle", type=_enum(OracleKind), help="exact or fast (default: fast on cuda)")
    fuzz.add_argument("--repro-dir", type=Path, metavar="DIR", help="a bundle per distinct failure, and its shrunk one")
    fuzz.add_argument("--stream", type=Path, metavar="PATH.jsonl", help="every result, as it is made")
    fuzz.add_argument("--shrink-seconds", type=float, default=30.0, help="shrink budget per failure (default: 30)")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = _Parser(prog="difftest", description="Prove or disprove, row by row, that a paged MQA logits kernel "
                     "computes what it should. Documentation: docs/README.md in the repository.")
    parser.add_argument("--version", action="version", version=f"difftest {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_run(commands)
    replay = commands.add_parser("replay", help="re-run a reproducer bundle; exit 1 if it still fails")
    replay.add_argument("bundle", type=Path, metavar="BUNDLE")
    replay.add_argument("--backends", type=_names, help="replay through this backend instead of the recorded one")
    replay.add_argument("--trust-bundle", action="store_true",
                        help="import the module the bundle names as its backend (that runs its code)")
    shrink = commands.add_parser("shrink", help="reduce a bundle's failing case and write it as a new bundle")
    shrink.add_argument("bundle", type=Path, metavar="BUNDLE")
    shrink.add_argument("--seconds", type=float, default=30.0, help="time budget (default: 30)")
    shrink.add_argument("--out", type=Path, metavar="DIR", help="where the new bundle goes (default: beside BUNDLE)")
    shrink.add_argument("--backends", type=_names, help="shrink through this backend instead of the recorded one")
    shrink.add_argument("--trust-bundle", action="store_true",
                        help="import the module the bundle names as its backend (that runs its code)")
    _add_fuzz(commands)
    backends = commands.add_parser("backends", help="list backends and whether each can run here")
    backends.add_argument("--device", type=_enum(Device), default=Device.CPU)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options of `argv` (default: sys.argv[1:]); `argv` itself goes along as args.argv, for the
    run info and for the children of a --gpus run."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The `difftest` command: its exit status (difftest.kinds.ExitStatus)."""
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error argparse already printed
        return int(exc.code or 0)
    commands = {"run": cmd_run, "backends": cmd_backends, "replay": cmd_replay, "shrink": cmd_shrink,
                "fuzz": cmd_fuzz}
    try:
        return commands[args.command](args)
    except SpecError as exc:
        print(f"difftest: error: {FLAGS.get(exc.field, exc.field)}={exc.value!r}: expected {exc.expected}",
              file=sys.stderr)
        return ExitStatus.USAGE
    except OutputError as exc:
        print(f"difftest: error: {FLAGS.get(exc.field, exc.field)}={exc.path!r}: {exc.reason}", file=sys.stderr)
        return ExitStatus.IO
    except Interrupted as exc:
        where = f"; kept in {', '.join(exc.kept)} (--resume {exc.kept[0]} continues it)" if exc.kept else ""
        print(f"\ndifftest: interrupted after {exc.results} results{where}", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except KeyboardInterrupt:
        print("\ndifftest: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED


def cmd_backends(args: argparse.Namespace) -> int:
    """`difftest backends`: every registered backend and whether it runs here."""
    from difftest.backends import available_names, get_backends  # deferred: loads torch

    for name in available_names():
        try:
            backend = get_backends([name])[0]
            reason = backend.unavailable_reason(args.device.value)
            contract = backend.contract
            detail = (f"{contract.length_encoding.value}, {contract.cache_layout.value}, "
                      f"{contract.mask.value}, {contract.library}")
        except SpecError as exc:
            reason, detail = str(exc), ""
        status = "available" if reason is None else f"unavailable: {reason}"
        print(f"{name:<28} {status}" + (f"  [{detail}]" if detail else ""))
    return ExitStatus.OK


def cmd_run(args: argparse.Namespace, shard_envs: list[dict[str, str]] | None = None) -> int:
    """`difftest run`. With --gpus, or with `shard_envs` (what each child's environment adds; how the
    tests spread a CPU run), the cases are spread over child processes, one shard each."""
    from difftest import session  # deferred: loads torch and the runner

    request = _run_request(args)
    progress = _Progress(enabled=not args.no_progress and sys.stderr.isatty())
    try:
        outcome = session.execute(request, on_result=progress.step, shard_envs=shard_envs)
    finally:
        progress.close()
    for note in outcome.notes:
        print(f"difftest: note: {note}", file=sys.stderr)
    _print_outcome(request, outcome)
    return outcome.status


def _run_request(args: argparse.Namespace) -> RunRequest:
    """The RunRequest of the options."""
    from difftest.config import RunConfig  # deferred: with session, below
    from difftest.plan import Shard, SuiteRequest  # deferred: with session, below
    from difftest.session import RunRequest  # deferred: loads torch and the runner

    suite = SuiteRequest(cases=args.cases, count=args.count, seed=args.seed, next_n=args.next_n,
                         block_sizes=args.block_sizes, batch=args.batch, max_model_len=args.max_model_len,
                         heads=args.heads, head_dim=args.head_dim, spec=_spec(args.spec) if args.spec else None,
                         case_filter=tuple(args.case_filter), shard=Shard.parse(args.shard) if args.shard else None)
    config = RunConfig(device=args.device.value, encoding=args.encoding, layout=args.layout, isolate=args.isolate,
                       timeout=args.timeout, repeat=args.repeat, sanitize=args.sanitize,
                       sanitize_all=args.sanitize_all, oracle=args.oracle, startup_timeout=args.startup_timeout)
    names = (args.backends or ()) + tuple(args.backend_module)
    return RunRequest(suite=suite, backends=names or None, config=config, report=args.report, stream=args.stream,
                      resume=args.resume, repro_dir=args.repro_dir, gpus=args.gpus, budget=args.budget,
                      argv=tuple(args.argv), overwrite=args.overwrite)


def _spec(text: str) -> object:
    """The CaseSpec of --spec; its errors name the spec's field under --spec."""
    from generators.spec import CaseSpec  # deferred: with session, above

    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # malformed, or nested past the parser's depth
        raise SpecError("--spec", text[:200], f"a JSON object ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise SpecError("--spec", text, "a JSON object of CaseSpec fields")
    try:
        return CaseSpec.from_json(data)
    except SpecError as exc:
        raise SpecError(f"--spec {exc.field}", exc.value, exc.expected) from None


def _print_outcome(request: RunRequest, outcome: RunOutcome) -> None:
    """The shards (of a spread run), the table, the results per GPU, the failures, and where files went."""
    from difftest import report  # deferred: with session, above

    if outcome.shards:
        print("\n".join(shard.describe() for shard in outcome.shards) + "\n")
    print(report.render_table(report.summarize(outcome.results)))
    reach = report.render_reach(outcome.results, outcome.plan) if outcome.plan else ""
    if reach:
        print("\n" + reach)
    devices = report.render_devices(outcome.results)
    if devices:
        print(devices)
    if outcome.info.get("not_started"):
        print(f"\nbudget spent: {len(outcome.info['not_started'])} planned cases not started (listed in the report)")
    failures = report.render_failures(outcome.results)
    if failures:
        print("\n" + failures)
    if request.report:
        print(f"\nreport: {request.report}")
    if outcome.stream:
        print(f"stream: {outcome.stream}")
    if outcome.bundles:
        print(f"\nreproducers: {outcome.bundles} bundle(s) under {request.repro_dir} (difftest replay BUNDLE; "
              "--trust-bundle for a backend given as package.module:object)")


def _bundle_backend(args: argparse.Namespace, bundle: object) -> object:
    """The backend to replay or shrink a bundle through: --backends, else the recorded one."""
    from difftest.backends import get_backends  # deferred: loads torch
    from difftest.replay import bundle_backend  # deferred: loads torch

    if args.backends:
        return get_backends(list(args.backends))[0]
    return bundle_backend(bundle, trust=args.trust_bundle)  # type: ignore[arg-type]


def cmd_replay(args: argparse.Namespace) -> int:
    """`difftest replay`: exit 1 when the bundle still fails."""
    from difftest.bundle import load_bundle  # deferred: loads torch
    from difftest.hardware import CUDA_UNAVAILABLE, cuda_unavailable_reason  # deferred: loads torch
    from difftest.replay import render_replay, replay  # deferred: loads torch

    bundle = load_bundle(args.bundle)
    if bundle.config.device == "cuda" and cuda_unavailable_reason():
        raise SpecError("device", "cuda", f"a device torch can see ({CUDA_UNAVAILABLE})")
    result = replay(bundle, _bundle_backend(args, bundle))  # type: ignore[arg-type]
    print(render_replay(bundle, result))
    return ExitStatus.FAILED if result.verdict.failed else ExitStatus.OK


def cmd_shrink(args: argparse.Namespace) -> int:
    """`difftest shrink`: the smallest case that fails the same way, as a new bundle."""
    from difftest.backends import as_loaded  # deferred: loads torch
    from difftest.bundle import load_bundle, write_bundle  # deferred: loads torch
    from difftest.shrink import shrink  # deferred: loads torch

    bundle = load_bundle(args.bundle)
    backend = as_loaded(_bundle_backend(args, bundle))
    found = shrink(bundle, backend, bundle.config, args.seconds)
    folder = write_bundle(args.out or bundle.path.parent, found.case, found.result, bundle.config, backend.origin,
                          backend.contract.library, field="--out" if args.out else "bundle")
    print(f"{found.summary()}\nbundle: {folder}")
    return ExitStatus.OK


def cmd_fuzz(args: argparse.Namespace) -> int:
    """`difftest fuzz`: exit 1 when the campaign found a failure."""
    from difftest import fuzz, report  # deferred: loads torch and the runner
    from difftest.config import RunConfig

    campaign = fuzz.Campaign(budget=args.budget, backends=args.backends, until_failures=args.until_failures,
                             seed=args.seed, repro_dir=args.repro_dir, stream=args.stream,
                             shrink_seconds=args.shrink_seconds,
                             config=RunConfig(device=args.device.value, isolate=args.isolate, oracle=args.oracle))
    outcome = fuzz.fuzz(campaign)
    print(report.render_table(report.summarize(outcome.results)))
    print("\n" + report.render_reach(outcome.results))
    print("\n" + fuzz.render_campaign(outcome))
    return ExitStatus.FAILED if outcome.found else ExitStatus.OK


class _Progress:
    """A one-line count of results on stderr, drawn only on a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.done, self.enabled = 0, enabled

    def step(self, result: CaseResult) -> None:
        self.done += 1
        if self.enabled:
            sys.stderr.write(f"\r{self.done} results ({result.backend} on {result.case})\033[K")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


if __name__ == "__main__":
    sys.exit(main())
