"""`difftest run`, `backends`, `replay` and `shrink`: a thin shell over generators, runner and report."""

from __future__ import annotations

import argparse
import fnmatch
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from difftest.errors import SpecError, require

if TYPE_CHECKING:
    from difftest.backends import Backend
    from difftest.report import ResultStream
    from difftest.runner import CaseResult, RunConfig
    from generators.spec import CaseSpec

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MAX_SEED = 2**62  # seeds grow by 1000 per spec; torch takes any int64


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, like every other difftest error, and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"difftest: error: {message} (see {self.prog} --help)\n")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="difftest", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    # No abbreviated options: a --gpus run hands its command line to its children less a few options.
    run = commands.add_parser("run", help="run cases through backends and compare with the oracle", allow_abbrev=False)
    run.add_argument("--backends", help="comma-separated backend names (default: every registered one)")
    run.add_argument("--backend-module", action="append", default=[], metavar="PKG.MOD:OBJ",
                     help="a user backend: a Backend, a factory, or a difftest.backend-decorated function")
    run.add_argument("--cases", default="all", help="random, edges or all (default: all)")
    run.add_argument("--count", type=int, help="seeds per random spec (default: 6; 1 with --spec)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--next-n", type=_int_list, help="e.g. 1,2,4: one copy of every spec per value")
    run.add_argument("--block-sizes", type=_int_list, help="e.g. 1,64: one copy of every spec per value")
    run.add_argument("--batch", type=int, help="B of the random specs")
    run.add_argument("--max-model-len", type=int, help="max_model_len of the random specs")
    run.add_argument("--heads", type=int, help="H of the random specs")
    run.add_argument("--head-dim", type=int, help="D of the random specs")
    run.add_argument("--spec", metavar="JSON", help="one CaseSpec as JSON (fields not given keep their defaults) "
                     "instead of the suite: --count cases from --seed on")
    run.add_argument("--encoding", help="what-if: hand every backend this length encoding instead")
    run.add_argument("--layout", help="what-if: hand every backend this cache layout instead")
    run.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    run.add_argument("--report", metavar="PATH", help="write the JSON report here")
    run.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    run.add_argument("--repro-dir", metavar="DIR", help="write a reproducer bundle here for every failing result")
    run.add_argument("--case-filter", action="append", default=[], metavar="GLOB",
                     help="run only the cases whose name matches (fnmatch, e.g. 'length-one-*'); repeatable")
    run.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                     help="run each backend in a worker process of its own, so a crash or a hang costs only "
                          "its verdict (CRASH, TIMEOUT) (default: on for cuda or with --timeout, off for cpu)")
    run.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="seconds one case (all its --repeat launches) may take in a worker before it is "
                          "killed: TIMEOUT (needs isolation; default 600)")
    run.add_argument("--repeat", type=int, default=1, metavar="K",
                     help="launch each backend K times per case: bitwise-stable, stable within tolerance, "
                          "or unstable = FAIL(nondeterministic) (default: 1)")
    run.add_argument("--stream", metavar="PATH.jsonl",
                     help="append each result to this JSONL file the moment it is made, so a killed run "
                          "keeps its results (default: the --report path with suffix .jsonl)")
    run.add_argument("--resume", metavar="REPORT",
                     help="a JSON report or JSONL stream of an earlier run of the same cases: its (backend, "
                          "case) results are kept and only the missing pairs run")
    run.add_argument("--sanitize", metavar="TOOL",
                     help="memcheck, racecheck, initcheck or synccheck: replay each failing result under "
                          "NVIDIA compute-sanitizer in a fresh process and attach its findings (cuda)")
    run.add_argument("--sanitize-all", action="store_true",
                     help="with --sanitize: replay every result that ran, passing ones too")
    run.add_argument("--shard", metavar="I/N",
                     help="run only the planned cases (after --case-filter) whose index in the plan is I mod N")
    run.add_argument("--gpus", type=int, metavar="N",
                     help="spread the cases over N child processes, one GPU each (shard I of N on entry I of "
                          "CUDA_VISIBLE_DEVICES, else on GPU I), merged in plan order into one table, --report and "
                          "--stream (written when the children end); --device cuda only; not with --resume or --shard")
    replay = commands.add_parser("replay", help="re-run a reproducer bundle; exit 1 if it still fails")
    replay.add_argument("bundle", metavar="BUNDLE")
    shrink = commands.add_parser("shrink", help="reduce a bundle's failing case and write it as a new bundle")
    shrink.add_argument("bundle", metavar="BUNDLE")
    shrink.add_argument("--seconds", type=float, default=30.0, help="time budget (default: 30)")
    shrink.add_argument("--out", metavar="DIR", help="where the new bundle goes (default: beside BUNDLE)")
    backends = commands.add_parser("backends", help="list backends and whether each can run here")
    backends.add_argument("--device", default="cpu")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options of `argv` (default: sys.argv[1:]); `argv` itself goes along as args.argv, for the
    run info and for the children of a --gpus run."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        commands = {"run": cmd_run, "backends": cmd_backends, "replay": cmd_replay, "shrink": cmd_shrink}
        return commands[args.command](args)
    except SpecError as exc:
        print(f"difftest: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def cmd_backends(args: argparse.Namespace) -> int:
    from difftest.backends import available_names, load_backend

    for name, target in available_names().items():
        try:
            backend = load_backend(target, f"backend {name!r}")
            reason = backend.unavailable_reason(args.device)
            contract = backend.contract
            detail = (f"{contract.length_encoding.value}, {contract.cache_layout.value}, "
                      f"{contract.mask.value}, {contract.library}")
        except SpecError as exc:
            reason, detail = str(exc), ""
        status = "available" if reason is None else f"unavailable: {reason}"
        print(f"{name:<28} {status}" + (f"  [{detail}]" if detail else ""))
    return EXIT_OK


def cmd_run(args: argparse.Namespace, shard_envs: list[dict[str, str]] | None = None) -> int:
    """`difftest run`. With --gpus, or with `shard_envs` (what each child's environment adds; how the
    tests spread a CPU run), the cases are spread over child processes, one shard each."""
    from difftest.backends import get_backends
    from difftest.replay import ReproWriter
    from difftest.runner import run
    from generators import build_case

    config = _config(args)
    if shard_envs is None and args.gpus is not None:
        shard_envs = _gpu_environments(args)
    backends = get_backends(args.backends.split(",") if args.backends else None, tuple(args.backend_module))
    pairs = _plan(args)
    if shard_envs is not None:
        return _run_spread(args, config, backends, pairs, shard_envs)
    done = _resumed(args.resume, pairs, backends, config) if args.resume else {}
    progress = _Progress(len(pairs) * len(backends) - len(done),
                         enabled=not args.no_progress and sys.stderr.isatty())
    started = time.time()
    # Drawn on the run's device: a 128K-context batch would take seconds to draw on the CPU.
    # A seed reproduces its case on the same device type.
    cases = (build_case(spec, seed, config.device, name=case_name(spec, seed)) for spec, seed in pairs)
    repro = ReproWriter(args.repro_dir, config, backends, tuple(args.backend_module)) if args.repro_dir else None
    stream = _open_stream(args, _run_info(args, config, started, len(pairs), len(done)), done)

    def on_result(result: CaseResult) -> None:
        progress.step(result)
        if stream:
            stream.write(result)
        if repro:
            repro.on_result(result)

    try:
        results = run(backends, repro.track(cases) if repro else cases, config, on_result=on_result, done=done,
                      targets=_targets(args, backends))
    finally:
        if stream:
            stream.close()
    progress.close()
    return _finish(args, results, _run_info(args, config, started, len(pairs), len(done)),
                   len(repro.written) if repro else 0, stream)


def _gpu_environments(args: argparse.Namespace) -> list[dict[str, str]]:
    """What --gpus adds to each child's environment (its CUDA_VISIBLE_DEVICES); SpecError naming --gpus."""
    import torch

    from difftest.spread import gpu_environments

    return gpu_environments(args.gpus, args.device, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def _run_spread(args: argparse.Namespace, config: RunConfig, backends: list[Backend],
                pairs: list[tuple[CaseSpec, int]], envs: list[dict[str, str]]) -> int:
    """The plan's shards in child processes (difftest.spread), one per entry of `envs`, their results
    merged in plan order and reported as one run's; exit status 1 as well when a child died."""
    from difftest.spread import merge, run_shards, shard_of

    require(not args.resume, "--resume", args.resume, "a run without --gpus (resume a --gpus run's report or "
            "stream on one GPU)")
    require(not args.shard, "--shard", args.shard, "a run without --gpus (--gpus shards the run itself)")
    started = time.time()
    expected = [len(shard_of(pairs, i, len(envs))) * len(backends) for i in range(len(envs))]
    shards = run_shards(args.argv, envs, expected)
    results = merge([case_name(spec, seed) for spec, seed in pairs], shards)
    info = {**_run_info(args, config, started, len(pairs)), "shards": [shard.info() for shard in shards]}
    stream = _open_stream(args, info, {})
    if stream:
        for result in results:
            stream.write(result)
        stream.close()
    print("\n".join(shard.describe() for shard in shards) + "\n")
    code = _finish(args, results, info, _bundles(args.repro_dir, results), stream)
    return EXIT_FAILED if any(shard.died for shard in shards) else code


def _bundles(repro_dir: str | None, results: list[CaseResult]) -> int:
    """The reproducer bundles of `results` that the children wrote under --repro-dir."""
    from difftest.bundle import bundle_name

    if repro_dir is None:
        return 0
    return sum((Path(repro_dir) / bundle_name(r)).is_dir() for r in results if r.verdict.failed)


def _finish(args: argparse.Namespace, results: list[CaseResult], info: dict[str, Any], bundles: int,
            stream: ResultStream | None) -> int:
    """Print the table, the results per GPU and the failures, write the JSON report; the exit status."""
    from difftest import report

    print(report.render_table(report.summarize(results)))
    devices = report.render_devices(results)
    if devices:
        print(devices)
    failures = report.render_failures(results)
    if failures:
        print("\n" + failures)
    if args.report:
        print(f"\nreport: {report.write_json(args.report, results, info)}")
    if stream:
        print(f"stream: {stream.path}")
    if bundles:
        print(f"\nreproducers: {bundles} bundles under {args.repro_dir} (difftest replay BUNDLE)")
    return EXIT_FAILED if any(r.verdict.failed for r in results) else EXIT_OK


def _targets(args: argparse.Namespace, backends: list[Backend]) -> dict[str, str]:
    """Backend name -> the 'package.module:object' it was loaded from: what its worker rebuilds it from."""
    from difftest.backends import available_names

    modules = tuple(args.backend_module)
    # get_backends returns the registered ones first, then those of --backend-module in order.
    loaded = backends[len(backends) - len(modules):] if modules else []
    registered = available_names()
    return {**{b.name: registered[b.name] for b in backends if b.name in registered},
            **{b.name: m for b, m in zip(loaded, modules, strict=True)}}


def case_name(spec: CaseSpec, seed: int) -> str:
    """The name `difftest run` gives the case drawn from (spec, seed): what --case-filter and --resume match."""
    return f"{spec.name}-s{seed}"


def _config(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of the options; its SpecError names the option, not the field."""
    from difftest.kinds import CacheLayout, LengthEncoding
    from difftest.runner import RunConfig

    try:
        return RunConfig(device=_device(args.device), encoding=_enum(LengthEncoding, args.encoding, "--encoding"),
                         layout=_enum(CacheLayout, args.layout, "--layout"), isolate=args.isolate,
                         timeout=args.timeout, repeat=args.repeat, sanitize=args.sanitize,
                         sanitize_all=args.sanitize_all)
    except SpecError as exc:
        option = exc.field if exc.field.startswith("--") else f"--{exc.field.replace('_', '-')}"
        raise SpecError(option, exc.value, exc.expected) from None


def _plan(args: argparse.Namespace) -> list[tuple[CaseSpec, int]]:
    """The (spec, seed) pairs of the options, narrowed by --case-filter, then to --shard; SpecError for a bad value."""
    from difftest.spread import parse_shard, shard_of
    from generators.cases import suite
    from generators.spec import CaseSpec

    if args.count is not None and args.count < 0:
        raise SpecError("--count", args.count, "an integer >= 0")
    if not -MAX_SEED <= args.seed < MAX_SEED:
        raise SpecError("--seed", args.seed, "an integer in [-2**62, 2**62)")
    overrides = {k: v for k, v in dict(batch=args.batch, max_model_len=args.max_model_len, heads=args.heads,
                                       head_dim=args.head_dim).items() if v is not None}
    # Checked even where they apply to no spec (--cases edges): a bad value is never silently ignored.
    CaseSpec().replace(**overrides).validate()
    pairs = _spec_pairs(args) if args.spec else suite(args.cases, args.count or 6, args.seed, args.next_n,
                                                       args.block_sizes, **overrides)
    pairs = _filtered(pairs, args.case_filter) if args.case_filter else pairs
    return shard_of(pairs, *parse_shard(args.shard)) if args.shard else pairs


def _filtered(pairs: list[tuple[CaseSpec, int]], globs: list[str]) -> list[tuple[CaseSpec, int]]:
    """The pairs whose case name matches one of `globs`; every glob must match some case (else it is a typo)."""
    names = [case_name(s, seed) for s, seed in pairs]
    for glob in globs:
        if not any(fnmatch.fnmatchcase(name, glob) for name in names):
            raise SpecError("--case-filter", glob, f"a pattern matching some of the {len(names)} case names, "
                            f"e.g. {names[:3]}")
    return [pair for pair, name in zip(pairs, names, strict=True)
            if any(fnmatch.fnmatchcase(name, glob) for glob in globs)]


def _spec_pairs(args: argparse.Namespace) -> list[tuple[object, int]]:
    """(spec, seed) pairs of --spec: the one spec at --seed, and the next seeds up to --count."""
    import json

    from generators.spec import CaseSpec

    try:
        data = json.loads(args.spec)
    except json.JSONDecodeError as exc:
        raise SpecError("--spec", args.spec, f"a JSON object ({exc})") from None
    if not isinstance(data, dict):
        raise SpecError("--spec", args.spec, "a JSON object of CaseSpec fields")
    spec = CaseSpec.from_json(data)
    return [(spec, args.seed + i) for i in range(args.count or 1)]


def _resumed(path: str, pairs: list[tuple[CaseSpec, int]], backends: list[Backend],
             config: RunConfig) -> dict[tuple[str, str], CaseResult]:
    """The results of `path` that belong to this run, by (backend, case); SpecError when they cannot.

    A result belongs when its backend and case are in the run. It must have been made from the same
    spec on the same device, or the merged report would mix two different runs.
    """
    from difftest.report import load_results

    specs = {case_name(s, seed): s.to_json() for s, seed in pairs}
    names = {b.name for b in backends}
    kept = {}
    for result in load_results(path):
        if result.backend not in names or result.case not in specs:
            continue
        if result.spec != specs[result.case] or result.device != config.device:
            raise SpecError("--resume", path, f"results of this run's cases: {result.case} there was made from "
                            f"another spec or device ({result.device}); run with the same options")
        kept[(result.backend, result.case)] = result
    return kept


def _open_stream(args: argparse.Namespace, info: dict[str, Any],
                 done: dict[tuple[str, str], CaseResult]) -> ResultStream | None:
    """The JSONL stream: --stream, else beside --report; a resumed run appends to its own stream,
    and a new stream starts with the results it resumes, so every stream holds its whole run."""
    from difftest.report import ResultStream, is_stream

    target = args.stream or (str(Path(args.report).with_suffix(".jsonl")) if args.report else None)
    if target is None:
        return None
    same = bool(args.resume) and Path(args.resume).resolve() == Path(target).resolve()
    if same and not is_stream(target):
        raise SpecError("--stream", target, "a JSONL stream to append to, not the JSON report given to --resume")
    stream = ResultStream(target, append=same)
    stream.header(info)
    if not same:
        for result in done.values():
            stream.write(result)
    return stream


def cmd_replay(args: argparse.Namespace) -> int:
    from difftest.bundle import load_bundle
    from difftest.replay import render_replay, replay

    bundle = load_bundle(args.bundle)
    _device(bundle.config.device)
    result = replay(bundle)
    print(render_replay(bundle, result))
    return EXIT_FAILED if result.verdict.failed else EXIT_OK


def cmd_shrink(args: argparse.Namespace) -> int:
    from difftest.bundle import load_bundle, write_bundle
    from difftest.replay import bundle_backend
    from difftest.shrink import shrink

    bundle = load_bundle(args.bundle)
    _device(bundle.config.device)
    backend = bundle_backend(bundle)
    found = shrink(bundle, backend, bundle.config, args.seconds)
    folder = write_bundle(args.out or bundle.path.parent, found.case, found.result, bundle.config,
                          bundle.backend_module, backend.contract.library)
    print(f"{found.summary()}\nbundle: {folder}")
    return EXIT_OK


def _device(name: str) -> str:
    import torch

    if name not in ("cpu", "cuda"):
        raise SpecError("--device", name, "cpu or cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device", name, "a device torch can see (torch.cuda.is_available() is False)")
    return name


def _enum(kind: type, value: str | None, field: str):
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        raise SpecError(field, value, f"one of {[m.value for m in kind]}") from None


def _run_info(args: argparse.Namespace, config: RunConfig, started: float, cases: int,
              resumed: int = 0) -> dict[str, object]:
    import torch

    import difftest

    # A --gpus parent computes nothing: its results name their GPUs (CaseResult.gpu).
    gpu = torch.cuda.get_device_name() if args.device == "cuda" and args.gpus is None else None
    return {"command": "difftest " + shlex.join(args.argv), "seed": args.seed, "cases": cases,
            "device": args.device, "gpu": gpu, "torch": torch.__version__, "difftest": difftest.__version__,
            "python": platform.python_version(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "seconds": round(time.time() - started, 3), "encoding_override": args.encoding,
            "layout_override": args.layout, "isolated": config.isolated, "timeout": config.timeout,
            "repeat": config.repeat, "sanitize": config.sanitize, "sanitize_all": config.sanitize_all,
            "case_filter": args.case_filter, "shard": args.shard, "resumed_from": args.resume, "resumed": resumed}


class _Progress:
    """A one-line progress bar on stderr, drawn only on a terminal."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled

    def step(self, result: object) -> None:
        self.done += 1
        if self.enabled:
            filled = 30 * self.done // max(self.total, 1)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


if __name__ == "__main__":
    sys.exit(main())
