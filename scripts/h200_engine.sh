#!/usr/bin/env bash
# Device visit for the GPU engine (issue 12): its GPU tests, the fused oracle against DeepGEMM (SWEEP=1: and
# its tile sweep), where a small-regime fuzz batch spends its time (bench/fuzz_breakdown.py), the fuzz rate
# bench (RATE_SECONDS, WARMUP), and profiles of a warm campaign (cProfile; the main thread alone, pyinstrument).
# On the device, from the repo root (carry .device-deps and .whl):
#   bash scripts/h200_engine.sh OUTDIR          (ONLY=regex picks steps, as in the other scripts)
set -uo pipefail
out=${1:?usage: h200_engine.sh OUTDIR}
mkdir -p "$out"
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/env.txt"

step 00-gpu-tests python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/oracles/test_fused.py \
  tests/generators/test_tensors.py tests/difftest/test_isolate.py tests/difftest/backends/test_deep_gemm.py
step 01-fused python3 bench/fused_oracle.py ${SWEEP:+--sweep} --out "$out/fused-oracle"
step 02-breakdown python3 bench/fuzz_breakdown.py --device cuda --backends torch,deepgemm --out "$out/breakdown"
step 03-fuzz-rate python3 bench/fuzz_rate.py --device cuda --backends torch,deepgemm --seconds "${RATE_SECONDS:-30}" --regimes "${REGIMES:-small,large}" \
  --warmup "${WARMUP:-60}" --out "$out/fuzz-rate"
# Where a warm small-regime campaign's time goes: the bench's own campaign (seed 0), whose sizes its warm-up compiled.
step 04-fuzz-profile python3 -m cProfile -o "$out/fuzz-profile.pstats" -m difftest.cli fuzz --device cuda \
  --backends torch,deepgemm --max-batch 16 --max-context 8192 --heads 64 --head-dim 128 --block-size 64 \
  --shrink-seconds 0 --seed 0 --budget 30s
step 05-fuzz-profile-summary python3 -c "import pstats, sys; s = pstats.Stats(sys.argv[1]); \
s.sort_stats('cumulative').print_stats(50); s.sort_stats('tottime').print_stats(30)" "$out/fuzz-profile.pstats"
# The same campaign, the main thread alone (pyinstrument samples one thread; Python 3.12's cProfile hears
# every thread, the drawing thread's time mixed in): where the runner's own time goes.
step 06-fuzz-main-thread python3 -m pyinstrument -r text -o "$out/fuzz-main-thread.txt" -m difftest.cli fuzz \
  --device cuda --backends torch,deepgemm --max-batch 16 --max-context 8192 --heads 64 --head-dim 128 --block-size 64 \
  --shrink-seconds 0 --seed 0 --budget 30s
