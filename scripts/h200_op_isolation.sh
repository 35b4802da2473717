#!/usr/bin/env bash
# Device visit: worker isolation of the operations other than paged logits (difftest.engine.isolate.
# OperationWorker). Prepare here with scripts/prepare_device.sh, then on the device, from the repo root
# (carry .device-deps):
#   bash scripts/h200_op_isolation.sh reports/h200/op_isolation
# Writes OUTDIR/<step>.txt (the command, its output, its exit status), the steps' JSON reports and
# OUTDIR/summary.txt. ONLY=regex runs a subset. difftest exits 1 whenever a result failed.
#
# What each step should show:
#   <op>-isolated / <op>-in-process, for topk, ragged-logits and indexer on --cases random: the same
#       verdict for every (backend, case) in both runs (summary.txt: "same verdicts: True"), isolation
#       "worker" on every isolated result that ran, and the wall time of both (the price of the copies).
#   topk-crash: tests.broken_topk's aborting and sleeping backends registered next to torch-topk on the GPU:
#       CRASH (SIGABRT) and TIMEOUT (--timeout 5) on every case, torch-topk PASS on every case.
set -uo pipefail
out=${1:?usage: h200_op_isolation.sh OUTDIR}
mkdir -p "$out"
source scripts/device_env.sh

step 00-environment bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv'
for op in topk ragged-logits indexer; do
  step "$op-isolated" /usr/bin/time -f "wall %e s" $dt run --op "$op" --device cuda --cases random --isolate \
    --report "$out/$op-isolated.json"
  step "$op-in-process" /usr/bin/time -f "wall %e s" $dt run --op "$op" --device cuda --cases random --no-isolate \
    --report "$out/$op-in-process.json"
done
# A file, not stdin: the workers start by spawn, which imports the main module again (from its path; hence
# the __main__ guard).
cat > "$out/topk_crash.py" <<'PY'
import sys
from difftest.backends import torch_topk
from difftest.cli import main
from tests.broken_topk import Aborts, Sleeps
if __name__ == "__main__":
    for backend in (Aborts, Sleeps):
        torch_topk.TOPK_BACKENDS[backend.name] = backend
    sys.exit(main(["run", "--op", "topk", "--device", "cuda", "--cases", "random", "--timeout", "5", "--backends",
                   "aborts,sleeps,torch-topk", "--report", sys.argv[1], "-v"]))
PY
step topk-crash python3 "$out/topk_crash.py" "$out/topk-crash.json"

python3 - "$out" > "$out/summary.txt" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def verdicts(path):
    return {(r["backend"], r["case"]): (r["verdict"], r.get("isolation")) for r in json.loads(path.read_text())["results"]}
for op in ("topk", "ragged-logits", "indexer"):
    inside, outside = out / f"{op}-isolated.json", out / f"{op}-in-process.json"
    if not (inside.exists() and outside.exists()):
        print(op, "missing report"); continue
    a, b = verdicts(inside), verdicts(outside)
    same = {k: v[0] for k, v in a.items()} == {k: v[0] for k, v in b.items()}
    print(op, "same verdicts:", same, "isolation:", sorted({str(v[1]) for v in a.values()}))
    for key in sorted(set(a) | set(b)):
        if a.get(key, (None,))[0] != b.get(key, (None,))[0]:
            print("  differs", key, a.get(key), b.get(key))
crash = out / "topk-crash.json"
if crash.exists():
    print("topk-crash:", sorted({(r["backend"], r["verdict"]) for r in json.loads(crash.read_text())["results"]}))
PY
cat "$out/summary.txt"
