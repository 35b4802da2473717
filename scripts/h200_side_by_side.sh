#!/usr/bin/env bash
# Device visit: many backends side by side at production sizes (issue 29, "Out-of-memory is the harness's
# problem first"). Eleven copies of one correct Triton paged-logits kernel (tests/side_by_side_backends.py),
# each in its own worker, run the default production plan (the 2^31-logit cases hold 8 GiB of output per
# call): every result must be PASS, or a SKIP whose reason gives the bytes needed and free; never an ERROR
# from memory. Then ten copies and a planted one on the largest cases: the planted bug is still FAIL(mask).
# Prepare here with scripts/prepare_device.sh, then on the device, from the repo root (carry .device-deps):
#   bash scripts/h200_side_by_side.sh [OUTDIR]      (default reports/h200/side-by-side)
# BUDGET=SECONDS adds --budget to step 01, should it outgrow the device tool's 10-minute call (the report
# lists the cases not started); ONLY=regex runs a subset of the steps.
set -uo pipefail
out=${1:-reports/h200/side-by-side}
mkdir -p "$out"
source scripts/device_env.sh

module=tests.side_by_side_backends
copies=$(python3 -c "print(','.join(f'$module:Copy{i:02d}' for i in range(11)))")
ten=$(python3 -c "print(','.join(f'$module:Copy{i:02d}' for i in range(10)))")
# The cases whose memory is the point: the 2^31-logit pair, the 2^31-byte pools, the B = 128 draw, full contexts.
large="--case-filter logits-* --case-filter pool-* --case-filter random-b128* --case-filter max-model-len*"
set -f  # no globbing: the --case-filter patterns travel in an unquoted variable

summary() {  # summary REPORT: verdicts per backend, every ERROR, every memory SKIP and retry; status 1 on an ERROR from memory
  python3 - "$1" <<'PY'
import collections, json, re, sys
report = json.load(open(sys.argv[1]))
results = report["results"]
memory = re.compile(r"out of memory|can't allocate memory|CUDA_ERROR_OUT_OF_MEMORY", re.IGNORECASE)
verdicts = collections.defaultdict(collections.Counter)
for r in results:
    verdicts[r["backend"]][r["verdict"]] += 1
for backend, counts in sorted(verdicts.items()):
    print(f"{backend:<24} " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())))
notes = [r for r in results if r.get("memory")]
print(f"results with a memory note: {len(notes)}; run alone: {sum(bool(r['memory']['alone']) for r in notes)}; "
      f"retried alone after running out beside others: {sum(bool(r['memory']['retried']) for r in notes)}; "
      f"measured: {sum(r['memory']['measured'] is not None for r in notes)}")
for r in notes:
    if r["memory"]["retried"]:
        print(f"  retried: {r['backend']} on {r['case']}: {r['verdict']}; first try: {r['memory']['retried'][:160]}")
skips = [r for r in results if r["verdict"] == "SKIP" and memory.search(r["reason"] or "")]
for r in skips:
    print(f"  memory SKIP: {r['backend']} on {r['case']}: {r['reason']}")
unnumbered = [r for r in skips if "needs about" not in r["reason"] or " free on " not in r["reason"]]
errors = [r for r in results if r["verdict"] in ("ERROR", "CRASH")]
for r in errors:
    print(f"  {r['verdict']}: {r['backend']} on {r['case']}: {r['reason']}")
from_memory = [r for r in errors if memory.search(r["reason"] or "")]
print(f"ERROR/CRASH from memory: {len(from_memory)}; memory SKIPs without their numbers: {len(unnumbered)}; "
      f"not started: {len(report['run'].get('not_started', []))}")
sys.exit(1 if from_memory or unnumbered else 0)
PY
}

step 00-environment bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_capability())"'
step 01-eleven $dt run --device cuda --no-progress ${BUDGET:+--budget "$BUDGET"} --backends "$copies" \
  --report "$out/01-eleven.json"
step 01-eleven-summary summary "$out/01-eleven.json"
step 02-ten-and-planted $dt run --device cuda --no-progress $large --backends "$ten,$module:Planted" \
  --report "$out/02-ten-and-planted.json"
step 02-ten-and-planted-summary summary "$out/02-ten-and-planted.json"
