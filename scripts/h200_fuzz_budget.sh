#!/usr/bin/env bash
# Device visit (issue 29 items 3 and 4): `difftest fuzz` by root cause, within its budget, on the H200.
# One campaign at production shapes over torch, DeepGEMM and a planted kernel whose every window is one
# short (tests.user_backends:window_one_short, loaded with --backend-module as a user would). Then, from
# the campaign's own report: where its time went against the budget (run.campaign.phases), each signature
# with its variants, and whether every repro line carries --device cuda; last, the first signature's repro
# line is pasted as printed and must fail again (exit 1).
# Prepare with scripts/prepare_device.sh; on the device, from the repo root (carry .device-deps and .whl):
#   bash scripts/h200_fuzz_budget.sh [OUTDIR]   (default reports/h200/fuzz-budget; BUDGET=3m SHRINK=45)
# The report and bundles (gigabytes at production shapes) stay under /tmp; OUTDIR gets the text.
set -uo pipefail
out=${1:-reports/h200/fuzz-budget}
work=/tmp/fuzz-budget
mkdir -p "$out" "$work"
source scripts/device_env.sh

step 01-fuzz $dt fuzz --device cuda --budget "${BUDGET:-3m}" --shrink-seconds "${SHRINK:-45}" \
  --backends torch,deepgemm --backend-module tests.user_backends:window_one_short \
  --repro-dir "$work/bundles" --report "$work/01-fuzz.json" --no-progress

step 02-signatures python3 - "$work/01-fuzz.json" "$work/first-repro" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["run"]
campaign, budget = run["campaign"], run["budget"]
phases = campaign["phases"]
print(f"budget {budget:g} s: total {phases['total']:.1f} s (cases {phases['cases']:.1f} s, shrinking "
      f"{phases['shrinking']:.1f} s); over the budget by {max(phases['total'] - budget, 0):.1f} s")
for sign in campaign["signatures"]:
    print(f"{sign['backend']}: {sign['verdict']} pattern={sign['pattern']} error={sign['error']}: "
          f"{sign['results']} results; also {[(a['pattern'], a['results']) for a in sign['also']]}")
    print(f"  variants: {json.dumps(sign['variants'])}")
    print(f"  repro: {sign['repro']}")
    print(f"  --device cuda in it: {sign['repro'] is None or '--device cuda' in sign['repro']}")
first = next((s["repro"] for s in campaign["signatures"] if s["repro"]), None)
open(sys.argv[2], "w").write(first.removeprefix("difftest ") if first else "")
PY

# The first repro line as printed (`difftest` is `python3 -m difftest.cli` here): it must fail again.
step 03-pasted bash -c "$dt $(cat "$work/first-repro") --no-progress"
