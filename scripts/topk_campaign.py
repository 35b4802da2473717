"""Every top-k backend that loads here on every edge family of its contract, at the device's scale: the
verdict, the headline and whether a second call selects the same set, one line per family (beside `difftest
run --op topk`, which judges the same plan with guards and isolation). Run by `scripts/device_visit.sh topk` on the GPU
machine (PYTHONPATH=.):

    python3 scripts/topk_campaign.py --out reports/h200/topk/all   (writes results.jsonl and README.md)
    python3 scripts/topk_campaign.py --backends vllm-persistent-topk --out DIR
    python3 scripts/topk_campaign.py --build                       (only the JIT builds, each timed)

A backend that cannot load is listed with its reason; one that raises is ERROR with the first line; each
case runs twice, and a second selected set that differs from the first is recorded (ties may differ: the
multiset may not).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import torch

from difftest.backends import flaggems_topk, flashinfer_topk, sglang_topk, torch_topk, vllm_topk
from difftest.core.errors import first_line
from difftest.core.kinds import Device
from difftest.core.topk import encode_topk
from difftest.engine.topk_comparison import compare_topk
from difftest.generators.envelope import Scale, Target
from difftest.generators.topk import TopkPlanned, TopkSpec, build_topk_case, topk_plan
from difftest.oracles.topk import reference

TABLES = (torch_topk.TOPK_BACKENDS, flaggems_topk.TOPK_BACKENDS, vllm_topk.TOPK_BACKENDS,
          sglang_topk.TOPK_BACKENDS, flashinfer_topk.TOPK_BACKENDS)


def backends() -> dict[str, object]:
    """Every top-k backend, built."""
    return {name: make() for table in TABLES for name, make in table.items()}


def build(device: str) -> None:
    """Call each JIT backend once on a small case of each k it takes, timing the first call (the build)."""
    for name, backend in backends().items():
        if name.startswith(("flashinfer", "sglang")):
            reason = backend.unavailable_reason(device)
            if reason:
                print(f"{name}: SKIP {reason}", flush=True)
                continue
            for k in backend.contract.ks or (2048,):
                start = time.perf_counter()
                case = build_topk_case(TopkSpec(rows=2, width=4 * k, k=k), 0, device)
                try:
                    backend(encode_topk(case, backend.contract), None)
                    torch.cuda.synchronize()
                    print(f"{name} k={k}: built and ran in {time.perf_counter() - start:.1f} s", flush=True)
                except Exception as exc:  # a build failure is what this step reports
                    print(f"{name} k={k}: ERROR {type(exc).__name__}: {first_line(exc)}", flush=True)


def judge(backend: object, spec: TopkSpec, device: str) -> dict[str, object]:
    """One case of `spec` through `backend`: its verdict and what the comparison says."""
    case = build_topk_case(spec, 0, device)
    reason = backend.contract.accepts(case, device)
    if reason:
        return {"verdict": "SKIP", "reason": reason}
    truth = reference(case, backend.contract.nan)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        first = backend(encode_topk(case, backend.contract), None)
        torch.cuda.synchronize() if device == "cuda" else None
        seconds = time.perf_counter() - start
        second = backend(encode_topk(case, backend.contract), None)
    result = compare_topk(truth, first, case, backend.contract)
    again = compare_topk(truth, second, case, backend.contract)
    return {"verdict": result.verdict.value, "headline": result.headline(), "rows": case.rows, "width": case.width,
            "k": case.k, "seconds": round(seconds, 4), "second_verdict": again.verdict.value,
            "sets_differ_between_calls": bool((first.sort(dim=1).values != second.sort(dim=1).values).any()),
            "warnings": [first_line(w.message) for w in caught]}


def campaign(out: Path, device: str, chosen: set[str] | None = None) -> None:
    """Every backend (or those `chosen`) on every planned spec; results.jsonl and a README.md table."""
    out.mkdir(parents=True, exist_ok=True)
    target = Target.probe(Device(device), Scale.PRODUCTION if device == "cuda" else Scale.SMALL)
    lines, table = [], []
    for name, backend in backends().items():
        if chosen is not None and name not in chosen:
            continue
        reason = backend.unavailable_reason(device)
        if reason:
            table.append(f"| {name} | - | SKIP: {reason} |")
            continue
        for planned in topk_plan(backend.contract, target):
            if not isinstance(planned, TopkPlanned):
                lines.append({"backend": name, "family": planned.family.value, "omitted": planned.reason})
                continue
            try:
                record = judge(backend, planned.spec, device)
            except Exception as exc:  # a crashing backend is a result; the campaign goes on
                record = {"verdict": "ERROR", "error": f"{type(exc).__name__}: {first_line(exc)}"}
            record.update(backend=name, spec=planned.spec.name, library=backend.contract.library)
            lines.append(record)
            print(json.dumps(record), flush=True)
            table.append(f"| {name} | {planned.spec.name} | {record['verdict']}: "
                         f"{record.get('headline') or record.get('reason') or record.get('error')} |")
    (out / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (out / "README.md").write_text(
        f"# Top-k backends at {target.scale.value} scale\n\nCommand: `bash scripts/device_visit.sh topk OUTDIR` "
        f"(TAG, BACKENDS; scripts/topk_campaign.py), device {device}. Every case is seed 0 of its family "
        "(difftest.generators.topk.topk_plan).\n\n"
        "| backend | case | verdict |\n|---|---|---|\n" + "\n".join(table) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("reports/h200/topk"))
    parser.add_argument("--build", action="store_true", help="only build and time the JIT backends")
    parser.add_argument("--backends", help="comma-separated top-k backends (default: every one)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.build:
        build(args.device)
    else:
        campaign(args.out, args.device, set(args.backends.split(",")) if args.backends else None)


if __name__ == "__main__":
    main()
