#!/usr/bin/env bash
# Device visit: failures that explain themselves at production scale (issue 29, items 5 and 6). Prepare
# here with scripts/prepare_device.sh, then on the device, from the repo root (carry .device-deps):
#   bash scripts/h200_explain.sh reports/h200/explain
# Writes OUTDIR/<step>.txt (the command, its output, its exit status), the steps' JSON reports and
# OUTDIR/summary.txt (per backend: the relations named, the top-k overlaps, the tracebacks). ONLY=regex
# runs a subset. difftest exits 1 whenever a result failed, so 1 is expected from every step.
#
# What each step should show:
#   01  AITER's Triton kernels (re-paged to block 1, tile 64) on H 64, D 128 cases of 8K positions,
#       next_n 2, 3 and 4: FAIL(mask) named "AITER's mirrored MTP window" on every case, including rows
#       whose L is a multiple of 64 (the phantom 0.0 at p = L never written there); the wrong draft rows
#       j != next_n / 2; torch PASS. Windows past 2048 positions: numbers in the top-k column, not n/a.
#   02  DeepGEMM and torch on the same shapes (next_n 1, 2, 4): PASS with a top-k overlap of 1.000 (or a
#       hair under, from fp8 near-ties of the k-th value), never n/a.
#   03  planted kernels on the GPU (tests.user_backends): sequence_length_for_every_row named
#       per-sequence-length, mirrored_mtp_window named mtp-mirrored, window_one_short constant offset -1.
#   04  a backend raising two calls down (tests.broken_backends:raises_nested) in a worker over CUDA IPC:
#       ERROR with the whole traceback under -v, naming _launch_nested and the line of its raise, and the
#       same text in the JSON report.
set -uo pipefail
out=${1:?usage: h200_explain.sh OUTDIR}
mkdir -p "$out"
source scripts/device_env.sh

shapes="--device cuda --cases random --count 2 --heads 64 --head-dim 128 --max-model-len 8192 --no-progress"
step 00-environment bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_capability())"'
step 01-aiter-mirrored $dt run $shapes --next-n 2,3,4 --block-sizes 64 \
  --backends torch,aiter-triton-stage1,aiter-triton-fused --report "$out/01-aiter.json"
step 02-deepgemm-topk $dt run $shapes --next-n 1,2,4 --block-sizes 64 --backends torch,deepgemm \
  --report "$out/02-deepgemm.json"
step 03-planted $dt run $shapes --next-n 3 --block-sizes 64 --backends torch \
  --backend-module tests.user_backends:sequence_length_for_every_row \
  --backend-module tests.user_backends:mirrored_mtp_window --backend-module tests.user_backends:window_one_short \
  --report "$out/03-planted.json"
step 04-traceback $dt run --device cuda --isolate --cases edges --case-filter 'length-one-*' --no-progress -v \
  --backends torch --backend-module tests.broken_backends:raises_nested --report "$out/04-traceback.json"

python3 - "$out" > "$out/summary.txt" <<'EOF'
import collections, json, pathlib, sys

out = pathlib.Path(sys.argv[1])
for report in sorted(out.glob("0*.json")):
    results = json.loads(report.read_text())["results"]
    print(f"== {report.name}")
    by_backend = collections.defaultdict(list)
    for r in results:
        by_backend[r["backend"]].append(r)
    for backend, rs in by_backend.items():
        verdicts = collections.Counter(r["verdict"] for r in rs)
        relations = collections.Counter(
            json.dumps(r["comparison"]["explanation"]["relation"], sort_keys=True)
            for r in rs if r.get("comparison") and r["comparison"].get("explanation"))
        overlaps = [r["comparison"]["topk_overlap"] for r in rs if r.get("comparison")]
        tracebacks = [r["traceback"].splitlines()[-1] for r in rs if r.get("traceback")]
        print(f"{backend}: {dict(verdicts)}; top-k overlap {overlaps}")
        for relation, n in relations.items():
            print(f"    {n} x {relation}")
        for line in tracebacks[:2]:
            print(f"    traceback ends: {line}")
EOF
cat "$out/summary.txt"
