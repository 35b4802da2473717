"""DeepGEMM's ragged (prefill) logits against the fast oracle over the production-scale plan, on the GPU.

    python3 scripts/ragged_campaign.py --out reports/h200/ragged/campaign [--budget 300] [--seed 0]
    python3 scripts/ragged_campaign.py --out /tmp/c --device cpu --backend sglang-torch-ref-ragged  # the small plan

The ragged operation is not wired into `difftest run` yet, so this driver does what a run would: every spec of
ragged_plan(DeepGEMM's contract, Target.probe(cuda)) (rows up to 16K, keys up to 128K at H 64, D 128, the
2^31-byte key buffer and the logits past 2^31 elements), each case built on the GPU from (spec, seed), handed
to the backend as vLLM 0.33's prefill hands it, and judged against the fused oracle by the ragged comparison.
What the plan leaves out is listed with its reason. `--backend` names another entry of the RAGGED_BACKENDS
tables, `--device cpu` runs the small plan against the float64 oracle (the driver's own test does).

Robust and bounded: the cases run in a child process, cheapest first, one JSON line per result appended (and
flushed) to OUT/results.jsonl before the next case starts; a case that kills its process (a sticky CUDA error,
an abort) is recorded as CRASH with the child's last words and a fresh child takes the next case; a case still
running `--case-timeout` seconds after it started is killed and recorded as TIMEOUT; no case starts after
`--budget` seconds. A failing case small enough (keys x D under 64 MB) is saved as OUT/cases/<name>.npz
(RaggedCase.save) to replay. OUT/summary.md is the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

import torch  # after the path: a plain checkout needs it

from difftest.backends import aiter_ragged, deep_gemm_ragged, sglang_ragged, vllm_ragged
from difftest.backends.ragged_base import RaggedBackend
from difftest.core.kinds import Device, OracleKind
from difftest.core.ragged import encode_ragged
from difftest.engine.ragged_comparison import compare_ragged
from difftest.generators.envelope import Target
from difftest.generators.ragged import RaggedPlanned, RaggedSpec, build_ragged_case, footprint, ragged_plan
from difftest.oracles.ragged_reference import make_ragged_reference

SAVE_LIMIT = 64 << 20  # key bytes of a failing case worth saving beside the results
BACKENDS = {**deep_gemm_ragged.RAGGED_BACKENDS, **vllm_ragged.RAGGED_BACKENDS, **sglang_ragged.RAGGED_BACKENDS,
            **aiter_ragged.RAGGED_BACKENDS}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every child is told: the backend, where, which seed, and the plan's filter."""

    backend: str
    device: str
    seed: int
    only: str  # a regular expression the specs' names must match (search)

    def make(self) -> RaggedBackend:
        """A fresh instance of the backend named."""
        return BACKENDS[self.backend]()


def plan_entries(settings: Settings) -> tuple[list[dict], list[dict]]:
    """(the planned specs, cheapest first, as JSON; the omissions) of the backend's contract on this device."""
    contract = settings.make().contract
    planned, omitted = [], []
    for item in ragged_plan(contract, Target.probe(Device(settings.device))):
        if isinstance(item, RaggedPlanned):
            if re.search(settings.only, item.spec.name):
                planned.append({"spec": item.spec.to_json(), "families": [f.value for f in item.families],
                                "bytes": footprint(item.spec, contract)})
        else:
            omitted.append({"family": item.family.value, "spec": item.spec_name, "reason": item.reason})
    return sorted(planned, key=lambda entry: entry["bytes"]), omitted


def run_one(entry: dict, settings: Settings, out: Path) -> dict:
    """One case: built, run, judged against the fast oracle on a GPU (the float64 one on the CPU). Exceptions of
    the backend are its ERROR verdict."""
    spec = RaggedSpec.from_json(entry["spec"])
    backend = settings.make()
    record = {"case": f"{spec.name}-s{settings.seed}", "families": entry["families"], "rows": spec.rows,
              "keys": spec.keys, "heads": spec.heads, "head_dim": spec.head_dim, "library": backend.contract.library}
    reason = backend.unavailable_reason(settings.device)
    if reason:
        return {**record, "verdict": "SKIP", "detail": reason}
    started = time.perf_counter()
    case = build_ragged_case(spec, settings.seed, device=settings.device)
    record["max_seqlen_k"] = case.seqlen_k
    reason = backend.contract.accepts(case, settings.device)
    if reason:
        return {**record, "verdict": "SKIP", "detail": reason}
    try:
        got = backend(encode_ragged(case, backend.contract), None)
        if settings.device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # the backend raised: its verdict, and the campaign goes on
        return {**record, "verdict": "ERROR", "detail": f"{type(exc).__name__}: {str(exc)[:400]}"}
    call_s = time.perf_counter() - started
    oracle = OracleKind.FAST if settings.device == "cuda" else OracleKind.EXACT
    result = compare_ragged(make_ragged_reference(case, backend.contract.width(case), oracle), got, case,
                            backend.contract)
    comparison = result.comparison
    record.update(verdict=result.verdict.value, detail=result.headline(), max_rel_err=comparison.max_rel_err,
                  max_abs_err=comparison.max_abs_err, mask_rows=len(comparison.mask_rows),
                  nan_rows=len(comparison.nan_rows), value_rows=len(comparison.value_rows),
                  seconds=round(time.perf_counter() - started, 3), build_and_call_seconds=round(call_s, 3))
    if result.verdict.value != "PASS" and case.keys * case.head_dim <= SAVE_LIMIT:
        (out / "cases").mkdir(exist_ok=True)
        record["saved"] = str(case.to("cpu").save(out / "cases" / f"{record['case']}.npz"))
    return record


def child(out: Path, settings: Settings, first: int, stop_at: float) -> None:
    """Run the plan's entries from `first` on, announcing each before it starts (OUT/progress: 'running I T') so
    the parent can tell which one a crash or a hang belongs to; 'stopped I' when the budget is spent before
    entry I, 'done' after the last."""
    entries = json.loads((out / "plan.json").read_text())["planned"]
    for index in range(first, len(entries)):
        if time.time() > stop_at:
            (out / "progress").write_text(f"stopped {index}\n")
            return
        (out / "progress").write_text(f"running {index} {time.time()}\n")
        record = run_one(entries[index], settings, out)
        with open(out / "results.jsonl", "a") as stream:
            stream.write(json.dumps({"index": index, **record}) + "\n")
        print(f"{record['case']:40} {record['verdict']:18} {record.get('detail', '')[:150]}", flush=True)
    (out / "progress").write_text("done\n")


def parent(out: Path, settings: Settings, budget: float, case_timeout: float) -> int:
    """Children in turn until every entry has a result or the budget (counted from now, planning included) is
    spent; then the summary."""
    stop_at = time.time() + budget
    planned, omitted = plan_entries(settings)
    (out / "plan.json").write_text(json.dumps({"planned": planned, "omitted": omitted}, indent=1))
    (out / "results.jsonl").write_text("")
    first = 0
    while first < len(planned):
        first, stopped = _one_child(out, settings, first, planned, stop_at, case_timeout)
        if stopped:
            break
    for index in range(first, len(planned)):
        _append(out, index, planned[index], "NOT-RUN", f"the campaign's budget of {budget:.0f} s was spent")
    return _summary(out, planned, omitted)


def _one_child(out: Path, settings: Settings, first: int, planned: list[dict], stop_at: float,
               case_timeout: float) -> tuple[int, bool]:
    """Run a child from entry `first`: (the entry the next child starts from, whether the budget stopped it)."""
    (out / "progress").write_text("")
    with open(out / "child.log", "a") as log:
        command = [sys.executable, __file__, "--child", "--out", str(out), "--backend", settings.backend,
                   "--device", settings.device, "--seed", str(settings.seed), "--only", settings.only,
                   "--first", str(first), "--stop-at", str(stop_at)]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while process.poll() is None:
            time.sleep(0.5)
            state = _progress(out)
            if state[0] == "running" and time.time() - state[2] > case_timeout:
                process.kill()
                process.wait()
                _append(out, state[1], planned[state[1]], "TIMEOUT", f"killed {case_timeout:.0f} s after it started")
                return state[1] + 1, time.time() > stop_at
    state = _progress(out)
    if state[0] == "done":
        return len(planned), False
    if state[0] == "stopped":
        return state[1], True
    failed = state[1] if state[0] == "running" else first  # "": it died before its first case
    _append(out, failed, planned[failed], "CRASH", f"the child exited with status {process.returncode}: "
            f"{_last_words(out)}")
    return failed + 1, False


def _progress(out: Path) -> tuple[str, int, float]:
    """('running', I, started) | ('stopped', I, 0) | ('done', 0, 0) | ('', 0, 0) from OUT/progress."""
    words = (out / "progress").read_text().split()
    if not words:
        return "", 0, 0.0
    return words[0], int(words[1]) if len(words) > 1 else 0, float(words[2]) if len(words) > 2 else 0.0


def _last_words(out: Path) -> str:
    lines = (out / "child.log").read_text(errors="replace").strip().splitlines()
    return " | ".join(lines[-3:])[-400:]


def _append(out: Path, index: int, entry: dict, verdict: str, detail: str) -> None:
    spec = entry["spec"]
    record = {"index": index, "case": spec["name"], "families": entry["families"], "rows": spec["rows"],
              "keys": spec["keys"], "verdict": verdict, "detail": detail}
    with open(out / "results.jsonl", "a") as stream:
        stream.write(json.dumps(record) + "\n")


def _summary(out: Path, planned: list[dict], omitted: list[dict]) -> int:
    """OUT/summary.md (and the same on stdout); exit status 1 when a case neither passed nor was skipped."""
    results = sorted((json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line),
                     key=lambda r: r["index"])
    library = next((r["library"] for r in results if "library" in r), "(not loaded)")
    lines = [f"{library}: ragged logits against the oracle, {len(results)} of {len(planned)} planned cases", "",
             "| case | families | rows x keys | max_seqlen_k | verdict | max rel err | seconds | detail |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        error = f"{r['max_rel_err']:.2e}" if "max_rel_err" in r else ""
        lines.append(f"| {r['case']} | {', '.join(r['families'])} | {r['rows']} x {r['keys']} | "
                     f"{r.get('max_seqlen_k', '')} | {r['verdict']} | {error} | {r.get('seconds', '')} | "
                     f"{r.get('detail', '')[:300]} |")
    lines += ["", "Left out by the plan:", ""] + [f"* {o['family']}: {o['reason']}" for o in omitted]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    print(text)
    return 1 if any(r["verdict"] not in ("PASS", "SKIP") for r in results) else 0


def main() -> int:
    """The parent (plan, children, summary) or, with --child, one child's run of the plan from --first on."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backend", default="deepgemm-ragged", choices=sorted(BACKENDS))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="run only the specs whose names this regular expression finds")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds after which no case starts")
    parser.add_argument("--case-timeout", type=float, default=120.0, help="seconds one case may run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=float, default=float("inf"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    settings = Settings(args.backend, args.device, args.seed, args.only)
    if args.child:
        child(args.out, settings, args.first, args.stop_at)
        return 0
    return parent(args.out, settings, args.budget, args.case_timeout)


if __name__ == "__main__":
    sys.exit(main())
