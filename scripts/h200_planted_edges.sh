#!/usr/bin/env bash
# Issue 29 (alignment and offset edges) on the H200: the two planted kernels of tests/gpu_broken_backends.py
# that only the new families reach, under `difftest run --device cuda` defaults (the envelope plan at
# production scale, isolated), then their control on the cases of those families.
# Prepare here with scripts/prepare_device.sh, then on the device, from the repo root (carry .device-deps):
#   bash scripts/h200_planted_edges.sh [OUTDIR]        (default reports/h200/planted-edges)
# Writes OUTDIR/<step>.txt (the command line, its output, its exit status) and each step's JSON report.
# ONLY=regex runs a subset; BUDGET=SECONDS bounds each step's run (the report lists the cases not started).
#
# What each step should show (difftest exits 1 when a result fails, so 1 is expected in 01):
#   01  triton-last-tile-spill: FAIL(mask) on the four unaligned-max-model-len-* cases (131009, 131024,
#       131040, 131071: one past, 16 past, 32 past and one short of a multiple of 64, its tile at block
#       64: the last tile's store lands on the next row's first positions), PASS on every aligned case;
#       triton-int32-block-base: CRASH (illegal address) on block-base-past-2^31-bytes and
#       block-base-under-2^32-bytes (every used block starts past 2^31 bytes: the int32 offset is
#       negative), FAIL(nan) on block-base-past-2^32-bytes (the offset wraps onto the NaN canary blocks
#       below), PASS on pool-over-2^31-bytes (only its top block's tail crosses 2^31) and elsewhere.
#   02  triton-good on the same families' cases: PASS everywhere (exit status 0).
set -uo pipefail
out=${1:-reports/h200/planted-edges}
mkdir -p "$out"
source scripts/device_env.sh
set -f  # no globbing: --case-filter patterns travel in unquoted variables

planted="tests.gpu_broken_backends:TritonLastTileSpill,tests.gpu_broken_backends:TritonInt32BlockBase"
# FAMILIES=all runs the whole default plan in 01; by default the families these bugs live in and the aligned
# cases beside them (max-model-len).
families="--case-filter unaligned-* --case-filter block-base-* --case-filter pool-* --case-filter max-model-len*"
[[ ${FAMILIES:-} == all ]] && first="" || first=$families
step 01-planted $dt run --device cuda --no-progress ${BUDGET:+--budget "$BUDGET"} --backends "$planted" $first \
  --report "$out/01-planted.json" --overwrite

step 02-control $dt run --device cuda --no-progress ${BUDGET:+--budget "$BUDGET"} \
  --backends tests.gpu_broken_backends:TritonGood $families --report "$out/02-control.json" --overwrite
