#!/usr/bin/env bash
# Device visit for the GPU engine (issue 12): the fused oracle against DeepGEMM (SWEEP=1: and its tile
# sweep), where a small-regime fuzz batch spends its time (bench/fuzz_breakdown.py), and the fuzz rate
# bench. On the device, from the repo root (carry .device-deps and .whl):
#   bash scripts/h200_engine.sh OUTDIR          (ONLY=regex picks steps, as in the other scripts)
set -uo pipefail
out=${1:?usage: h200_engine.sh OUTDIR}
mkdir -p "$out"
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/env.txt"

step 00-fused-gpu-tests python3 -m pytest -q -p no:cacheprovider tests/oracles/test_fused.py -m gpu -rA
step 01-fused python3 bench/fused_oracle.py ${SWEEP:+--sweep} --out "$out/fused-oracle"
step 02-breakdown python3 bench/fuzz_breakdown.py --device cuda --backends torch,deepgemm --out "$out/breakdown"
step 03-fuzz-rate python3 bench/fuzz_rate.py --device cuda --backends torch,deepgemm --seconds 10 \
  --out "$out/fuzz-rate"
