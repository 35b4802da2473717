#!/usr/bin/env bash
# Isolation, guards and compute-sanitizer on the H200: the planted Triton kernels of
# tests/gpu_broken_backends.py (triton-good, triton-oob-read, triton-illegal-write) in one
# `difftest run --device cuda --isolate` beside torch and DeepGEMM, which must keep passing.
# Prepare here with scripts/prepare_device.sh, then on the device, from the repo root (carry
# .device-deps): bash scripts/h200_isolation.sh OUTDIR
# Writes OUTDIR/<step>.txt (the command line, its output, its exit status) and the steps' JSON and
# JSONL reports; every step runs whatever the one before it did. ONLY=regex runs a subset.
#
# What each step should show (difftest exits 1 whenever any result failed, so 1 is expected below):
#   02  torch, deepgemm, triton-good: PASS [bitwise-stable x3]; triton-oob-read: PASS (its stray read
#       is never used); triton-illegal-write: CRASH ("illegal memory access"), its worker replaced
#       for every case, with a memcheck finding "Invalid __global__ write of size 4 bytes".
#   03  triton-oob-read under --sanitize-all: FAIL(sanitizer), "Invalid __global__ read of size 4 bytes".
#   04  the same run as 02 without isolation: the first illegal write leaves the CUDA context
#       unusable, so that result is CRASH and the run itself dies at the next CUDA call (a
#       traceback, exit status 1): what isolation prevents.
#   05  02 killed with SIGKILL after a few streamed results, then --resume: every (backend, case) once.
set -uo pipefail
out=${1:?usage: h200_isolation.sh OUTDIR}
mkdir -p "$out"
source scripts/device_env.sh
# compute-sanitizer ships with the CUDA toolkit; difftest also looks in $CUDA_HOME/bin itself.
for bin in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [ -x "$bin/compute-sanitizer" ] && PATH=$PATH:$bin && break; done
export PATH
set -f  # no globbing: --case-filter patterns travel in unquoted variables

kernels="--backend-module tests.gpu_broken_backends:TritonGood --backend-module tests.gpu_broken_backends:TritonOobRead"
kernels="$kernels --backend-module tests.gpu_broken_backends:TritonIllegalWrite"
# Two DeepSeek-indexer cases (H 64, D 128, block 64; next_n 1 and 2, both native for DeepGEMM on sm90):
# few, since every failing result is replayed under memcheck, tens of seconds each.
cases="--cases random --count 1 --next-n 1,2 --block-sizes 64 --heads 64 --head-dim 128 --max-model-len 1024"
cases="$cases --case-filter random-mtp?-uniform-*"
run02="$dt run --device cuda --isolate --no-progress $cases --backends torch,deepgemm $kernels --repeat 3 --timeout 300"

streamed() {  # streamed FILE: result lines in a JSONL stream (0 before it exists)
  local n
  n=$(grep -c '"result"' "$1" 2>/dev/null)
  echo "${n:-0}"
}

kill_and_resume() {  # 02 in its own session, SIGKILL to the whole session after 5 results, then --resume
  local stream=$out/05-kill-resume.jsonl
  rm -f "$stream"
  # setsid: the run, its fork server and its workers form one process group, killed together.
  setsid $run02 --stream "$stream" > "$out/05-killed-run.txt" 2>&1 &
  local pid=$! waited=0
  while [ "$(streamed "$stream")" -lt 5 ] && kill -0 "$pid" 2>/dev/null && [ $waited -lt 1200 ]; do
    sleep 0.5; waited=$((waited + 1))
  done
  echo "results streamed before the kill: $(streamed "$stream")"
  kill -KILL -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  echo "results in the stream after the kill: $(streamed "$stream")"
  $run02 --stream "$stream" --resume "$stream" --report "$out/05-kill-resume.json"
  python3 - "$out/05-kill-resume.json" <<'PY'
import collections, json, sys
results = json.load(open(sys.argv[1]))["results"]
pairs = collections.Counter((r["backend"], r["case"]) for r in results)
print(f"final report: {len(results)} results, {len(pairs)} distinct (backend, case), "
      f"repeated: {[p for p, n in pairs.items() if n > 1]}")
PY
}

step 00-environment bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_capability())";
  command -v compute-sanitizer && compute-sanitizer --version || echo "compute-sanitizer: not found"'
step 01-backends $dt backends --device cuda
step 02-isolated-memcheck $run02 --sanitize memcheck --report "$out/02-isolated-memcheck.json"
step 03-oob-read-sanitize-all $dt run --device cuda --isolate --no-progress --cases random --count 1 --next-n 2 \
  --block-sizes 64 --heads 64 --head-dim 128 --max-model-len 1024 \
  --backend-module tests.gpu_broken_backends:TritonOobRead --sanitize memcheck --sanitize-all \
  --report "$out/03-oob-read-sanitize-all.json"
step 04-not-isolated $dt run --device cuda --no-isolate --no-progress $cases --backends torch,deepgemm $kernels \
  --report "$out/04-not-isolated.json"
step 05-kill-resume kill_and_resume
step 06-isolation-cost python3 bench/isolation_cost.py --device cuda --backends torch,deepgemm --count 2 \
  --json "$out/06-isolation-cost.json"
# The whole default suite (`difftest run --device cuda`): every backend that runs on this GPU.
step 06b-isolation-cost-default python3 bench/isolation_cost.py --device cuda --repeats 2 \
  --backends torch,deepgemm,deepgemm-flattened,aiter-triton-stage1,aiter-triton-fused,aiter-triton-stage1-ragged,aiter-triton-fused-ragged \
  --json "$out/06b-isolation-cost-default.json"
step 07-pytest python3 -m pytest -q -p no:cacheprovider tests/difftest/test_isolate.py tests/difftest/test_guards.py \
  tests/difftest/test_sanitize.py tests/difftest/test_fuzz_inputs.py
