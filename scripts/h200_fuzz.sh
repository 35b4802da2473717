#!/usr/bin/env bash
# Device visit: a `difftest fuzz` campaign at production shapes (torch oracle-as-backend + DeepGEMM
# native and flattened, isolated). Prepare with scripts/prepare_device.sh, then on the device, from the
# repo root (carry .device-deps and .whl): BUDGET=150s bash scripts/h200_fuzz.sh OUTDIR
set -uo pipefail
out=${1:?usage: h200_fuzz.sh OUTDIR}
mkdir -p "$out"
source scripts/device_env.sh

step 01-fuzz $dt fuzz --device cuda --budget "${BUDGET:-5m}" --backends torch,deepgemm,deepgemm-flattened \
  --repro-dir "$out/bundles" --stream "$out/01-fuzz.jsonl" --shrink-seconds "${SHRINK:-20}"
