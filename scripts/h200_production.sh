#!/usr/bin/env bash
# Device visit: the production-shape default run (docs: README "What `difftest run` does"). Prepare
# here with scripts/prepare_device.sh, then on the device, from the repo root (carry .device-deps):
#   bash scripts/h200_production.sh OUTDIR
# BUDGET=SECONDS adds --budget, should the run outgrow the device tool's 10-minute call; the report
# lists the planned cases that were not started.
set -uo pipefail
out=${1:?usage: h200_production.sh OUTDIR}
mkdir -p "$out"
source scripts/device_env.sh

step 00-environment bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_capability())"'
step 01-default-run $dt run --device cuda ${BUDGET:+--budget "$BUDGET"} --report "$out/01-default.json"
