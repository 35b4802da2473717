"""`difftest run`, `backends`, `replay` and `shrink`: a thin shell over generators, runner and report."""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from collections.abc import Sequence

from difftest.errors import SpecError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="difftest", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run cases through backends and compare with the oracle")
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
    replay = commands.add_parser("replay", help="re-run a reproducer bundle; exit 1 if it still fails")
    replay.add_argument("bundle", metavar="BUNDLE")
    shrink = commands.add_parser("shrink", help="reduce a bundle's failing case and write it as a new bundle")
    shrink.add_argument("bundle", metavar="BUNDLE")
    shrink.add_argument("--seconds", type=float, default=30.0, help="time budget (default: 30)")
    shrink.add_argument("--out", metavar="DIR", help="where the new bundle goes (default: beside BUNDLE)")
    backends = commands.add_parser("backends", help="list backends and whether each can run here")
    backends.add_argument("--device", default="cpu")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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


def cmd_run(args: argparse.Namespace) -> int:
    from difftest import report
    from difftest.backends import get_backends
    from difftest.contract import CacheLayout, LengthEncoding
    from difftest.replay import ReproWriter
    from difftest.runner import CaseResult, RunConfig, run
    from generators import build_case
    from generators.cases import suite

    config = RunConfig(device=_device(args.device), encoding=_enum(LengthEncoding, args.encoding, "--encoding"),
                       layout=_enum(CacheLayout, args.layout, "--layout"))
    names = args.backends.split(",") if args.backends else None
    backends = get_backends(names, tuple(args.backend_module))
    overrides = {k: v for k, v in dict(batch=args.batch, max_model_len=args.max_model_len, heads=args.heads,
                                       head_dim=args.head_dim).items() if v is not None}
    pairs = _spec_pairs(args) if args.spec else suite(args.cases, args.count or 6, args.seed, args.next_n,
                                                       args.block_sizes, **overrides)
    progress = _Progress(len(pairs) * len(backends), enabled=not args.no_progress and sys.stderr.isatty())
    started = time.time()
    # Drawn on the run's device: a 128K-context batch would take seconds to draw on the CPU.
    # A seed reproduces its case on the same device type.
    cases = (build_case(spec, seed, config.device, name=f"{spec.name}-s{seed}") for spec, seed in pairs)
    repro = ReproWriter(args.repro_dir, config, backends, tuple(args.backend_module)) if args.repro_dir else None

    def on_result(result: CaseResult) -> None:
        progress.step(result)
        if repro:
            repro.on_result(result)

    results = run(backends, repro.track(cases) if repro else cases, config, on_result=on_result)
    progress.close()
    summaries = report.summarize(results)
    print(report.render_table(summaries))
    failures = report.render_failures(results)
    if failures:
        print("\n" + failures)
    if args.report:
        info = _run_info(args, config, started, len(pairs))
        print(f"\nreport: {report.write_json(args.report, results, info)}")
    if repro and repro.written:
        print(f"\nreproducers: {len(repro.written)} bundles under {args.repro_dir} (difftest replay BUNDLE)")
    return EXIT_FAILED if any(r.verdict.failed for r in results) else EXIT_OK


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


def _run_info(args: argparse.Namespace, config: object, started: float, cases: int) -> dict[str, object]:
    import torch

    import difftest

    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    return {"command": "difftest " + shlex.join(sys.argv[1:]), "seed": args.seed, "cases": cases,
            "device": args.device, "gpu": gpu, "torch": torch.__version__, "difftest": difftest.__version__,
            "python": platform.python_version(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "seconds": round(time.time() - started, 3), "encoding_override": args.encoding,
            "layout_override": args.layout}


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
