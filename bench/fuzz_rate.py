"""Cases per second of `difftest fuzz` in two regimes, against the engine as it was.

The regimes are issue 12's (on a GPU: H 64, D 128, block 64):

* small: B <= 16, max_model_len <= 8K (goal: 500 cases/s),
* large: B <= 32, max_model_len <= 128K (goal: 20 cases/s).

On the CPU the same bounds apply at the toy shape (H 32, D 64, block 16; contexts up to 128 and 1024).
Each regime is measured twice (more with --jobs), for --seconds each, isolated (one worker process per backend):

* baseline, "runner.run, one case at a time": the regime's planned cases (difftest.workflows.fuzz.planned_cases,
  the same rounds a campaign draws) built one by one and handed to one difftest.engine.runner.run, as
  `difftest fuzz` did before batching;
* fuzz: difftest.workflows.fuzz.fuzz(Campaign(budget=--seconds, regime=...)), batching on, no shrinking;
* with --jobs N,...: the same campaign with N jobs side by side (Campaign.jobs), each against fuzz.

Both rates count from the start of the run to its end, so each includes one worker start-up. Before
any timing, the measured campaign itself (same seed) runs for --warmup seconds per regime, to compile
what a machine compiles once: Triton's oracle kernels, and DeepGEMM's JIT cache on disk, which holds
a schedule kernel per batch size rounded up to 32 (a batch, and the launch that retries its failed
members, each meet new sizes: a fresh machine compiles them during its first campaign, not later
ones). The table goes to stdout; fuzz_rate.json and fuzz_rate.md to --out.

    python bench/fuzz_rate.py --device cuda --backends torch,deepgemm --out reports/h200/fuzz-rate
    python bench/fuzz_rate.py --smoke --out /tmp/fuzz-rate     # CPU, torch, 0.5 s each, in-process (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

import torch  # after the path: a plain checkout needs it

from difftest.backends import Loaded, get_backends
from difftest.core.case import Case
from difftest.core.kinds import Device
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators.envelope import Target
from difftest.generators.regime import Regime
from difftest.generators.tensors import build_case
from difftest.workflows.fuzz import Campaign, describe_retries, fuzz, planned_cases

GPU_SHAPE = dict(heads=64, head_dim=128, block_size=64)
CPU_SHAPE = dict(heads=32, head_dim=64, block_size=16)
REGIMES = {  # name -> (bounds on a GPU, bounds on the CPU, goal in cases/s on the H200)
    "small": (Regime(max_batch=16, max_context=8192, **GPU_SHAPE), Regime(max_batch=16, max_context=128, **CPU_SHAPE),
              500),
    "large": (Regime(max_batch=32, max_context=131072, **GPU_SHAPE),
              Regime(max_batch=32, max_context=1024, **CPU_SHAPE), 20),
}
BASELINE = "runner.run, one case at a time"


@dataclasses.dataclass(frozen=True)
class Rate:
    """One measurement: cases run in seconds, the rate after the first result, and the verdicts."""

    cases: int
    seconds: float
    warm_per_second: float  # after the first result: worker start-up and first compilations left out
    verdicts: dict[str, int]
    tried_again: str = ""  # a campaign's re-runs of its batches' failed members (fuzz.describe_retries)

    @property
    def per_second(self) -> float:
        return self.cases / self.seconds if self.seconds > 0 else 0.0


def baseline(backends: list[Loaded], regime: Regime, config: RunConfig, seconds: float, seed: int) -> Rate:
    """The engine as it was: planned cases built one by one into one runner.run, for `seconds`."""
    takers: dict[str, frozenset[str] | None] = {}
    target = Target.probe(Device(config.device))

    def cases(start: float) -> Iterator[Case]:
        for planned in planned_cases(backends, target, regime, seed):
            if time.monotonic() - start > seconds:
                return
            takers[planned.name] = planned.backends
            yield build_case(planned.spec, planned.seed, config.device, name=planned.name)

    def takes(backend: str, case: Case) -> bool:
        return takers.get(case.name) is None or backend in takers[case.name]  # type: ignore[operator]

    heard: list[tuple[float, str]] = []  # (when, case) of every result
    start = time.monotonic()
    results = run(backends, cases(start), config, takes=takes,
                  on_result=lambda result: heard.append((time.monotonic(), result.case)))
    elapsed = time.monotonic() - start
    cases_after = len({case for _, case in heard} - {heard[0][1]}) if heard else 0
    warm = cases_after / (start + elapsed - heard[0][0]) if heard and cases_after else 0.0
    return Rate(len({r.case for r in results}), elapsed, warm, dict(Counter(r.verdict.value for r in results)))


def campaign(names: list[str], regime: Regime, config: RunConfig, seconds: float, seed: int, jobs: int = 1) -> Rate:
    """`difftest fuzz` in the regime for `seconds`, batching on, nothing shrunk, `jobs` campaigns side by side."""
    outcome = fuzz(Campaign(budget=seconds, backends=tuple(names), config=config, seed=seed, regime=regime,
                            shrink_seconds=0, jobs=jobs))
    return Rate(outcome.cases, outcome.seconds, outcome.warm_cases_per_second,
                dict(Counter(r.verdict.value for r in outcome.results)), describe_retries(outcome.retries))


def measure(args: argparse.Namespace) -> Iterator[tuple[str, dict]]:
    """Each regime's baseline and campaign rates, after a warm-up campaign, as each is measured."""
    names = args.backends.split(",")
    backends = get_backends(names)
    config = RunConfig(device=args.device, isolate=not args.smoke)
    for name in args.regimes.split(","):
        gpu, cpu, goal = REGIMES[name]
        regime = gpu if args.device == "cuda" else cpu
        if args.warmup:
            campaign(names, regime, config, args.warmup, seed=args.seed)
        before = baseline(backends, regime, config, args.seconds, args.seed)
        after = campaign(names, regime, config, args.seconds, args.seed)
        side_by_side = {jobs: campaign(names, regime, config, args.seconds, args.seed, jobs) for jobs in args.jobs}
        yield name, {"regime": dataclasses.asdict(regime), "goal": goal, BASELINE: dataclasses.asdict(before),
                     "difftest fuzz": dataclasses.asdict(after), "baseline_rate": before.per_second,
                     "fuzz_rate": after.per_second, "ratio": after.per_second / max(before.per_second, 1e-9),
                     "baseline_warm_rate": before.warm_per_second, "fuzz_warm_rate": after.warm_per_second,
                     "jobs": {str(jobs): {**dataclasses.asdict(rate), "rate": rate.per_second,
                                          "warm_rate": rate.warm_per_second} for jobs, rate in side_by_side.items()}}


def markdown(rows: dict[str, dict], header: str) -> str:
    """The table: one line per regime, both rates and their ratio."""
    jobs = sorted({int(n) for row in rows.values() for n in row.get("jobs", {})})
    lines = [header, "", "cases/s over the whole measurement (after the first result: without worker start-up "
             "and first compilations); --jobs N: N campaigns side by side, its ratio to difftest fuzz", "",
             f"| regime | bounds | {BASELINE} | difftest fuzz | ratio | "
             + "".join(f"--jobs {n} | " for n in jobs) + "goal (H200) |", "|---" * (6 + len(jobs)) + "|"]
    for name, row in rows.items():
        bounds = ", ".join(f"{k} {v}" for k, v in row["regime"].items() if v is not None)
        side = "".join(f"{r['rate']:.1f} ({r['warm_rate']:.1f}), {r['rate'] / max(row['fuzz_rate'], 1e-9):.2f}x | "
                       for r in (row["jobs"][str(n)] for n in jobs))
        lines.append(f"| {name} | {bounds} | {row['baseline_rate']:.1f} ({row['baseline_warm_rate']:.1f}) | "
                     f"{row['fuzz_rate']:.1f} ({row['fuzz_warm_rate']:.1f}) | {row['ratio']:.1f}x | {side}"
                     f"{row['goal']} |")
    return "\n".join(lines) + "\n"


def summary(folders: list[Path]) -> str:
    """The rows of earlier runs (each folder's fuzz_rate.json), in the order given, each campaign rate
    also relative to the same regime's in the folder before it (an A/B run alternates two engines)."""
    lines = [f"| run | regime | {BASELINE} | difftest fuzz | ratio | fuzz / the run before |",
             "|---|---|---|---|---|---|"]
    before: dict[str, float] = {}
    for folder in folders:
        rows = json.loads((folder / "fuzz_rate.json").read_text())["rows"]
        for name, row in rows.items():
            relative = f"{row['fuzz_rate'] / before[name]:.2f}x" if before.get(name) else ""
            lines.append(f"| {folder.name} | {name} | {row['baseline_rate']:.1f} | {row['fuzz_rate']:.1f} | "
                         f"{row['ratio']:.1f}x | {relative} |")
            before[name] = row["fuzz_rate"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backends", default=None,
                        help="comma-separated (default: torch,deepgemm on cuda, torch on cpu)")
    parser.add_argument("--seconds", type=float, default=20.0, help="per measurement (default: 20)")
    parser.add_argument("--warmup", type=float, default=15.0, help="warm-up campaign per regime, seconds (default: 15)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--regimes", default=",".join(REGIMES), help=f"comma-separated, of {list(REGIMES)} "
                        "(default: all)")
    parser.add_argument("--jobs", type=lambda text: [int(n) for n in text.split(",") if n], default=[],
                        metavar="N,...", help="also measure `difftest fuzz --jobs N` for each N (e.g. 2,3), after "
                        "difftest fuzz itself, each against it")
    parser.add_argument("--smoke", action="store_true", help="CPU, torch, 0.5 s each, no warm-up, in-process")
    parser.add_argument("--out", type=Path, help="folder for fuzz_rate.json and fuzz_rate.md (required to measure)")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="FOLDER",
                        help="measure nothing: print the rows of earlier runs' --out folders, in order")
    args = parser.parse_args(argv)
    if args.summarize:
        print(summary(args.summarize), end="")
        return 0
    if args.out is None:
        parser.error("--out is required to measure")
    if unknown := sorted(set(args.regimes.split(",")) - set(REGIMES)):
        parser.error(f"--regimes: {','.join(unknown)} is not one of {list(REGIMES)}")
    if args.smoke:
        args.device, args.seconds, args.warmup = "cpu", 0.5, 0.0
    args.backends = args.backends or ("torch,deepgemm" if args.device == "cuda" else "torch")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    gpu = f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    header = (f"difftest fuzz rate: backends {args.backends}, {args.device}{gpu}, torch {torch.__version__}, "
              f"{args.seconds:g} s per measurement, {'in-process' if args.smoke else 'isolated'}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict] = {}
    for name, row in measure(args):  # written after each regime: a run cut short keeps what it measured
        rows[name] = row
        (args.out / "fuzz_rate.md").write_text(markdown(rows, header))
        (args.out / "fuzz_rate.json").write_text(json.dumps({"header": header, "argv": sys.argv, "rows": rows},
                                                            indent=1) + "\n")
    print(markdown(rows, header), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
