#!/usr/bin/env bash
# The version axis on the H200 (issue 15, item 5): DeepGEMM as vendored in each vllm release, vLLM's
# Triton decode kernel from each release that has it, and AITER's Triton kernels from the pinned wheel
# and from AITER's main branch, each version chosen by putting its directory first on PYTHONPATH.
# Prepare here, from the repo root: bash scripts/prepare_device.sh (PREPARE_DEPS names the script that writes .device-deps)
# and bash scripts/prepare_versions.sh. Device, carry [".device-deps", ".whl"]:
#   bash scripts/h200_versions_smoke.sh /tmp/smoke; tar czf $OUT/versions-smoke.tgz -C /tmp smoke
# (the device returns at most 8 files: the steps' .txt, .json and .jsonl travel as one archive).
# Writes OUTDIR/<step>.txt (the command line, its output, its exit status) and each run's JSON report.
# ONLY=regex runs a subset (one device call is 10 minutes; each DeepGEMM version JIT-compiles its
# kernels afresh); FILTER (default '*') and BUDGET (default 60 s) shape every envelope run.
set -uo pipefail
out=${1:?usage: h200_versions_smoke.sh OUTDIR}
mkdir -p "$out"
source scripts/device_env.sh
set -f  # no globbing: the case filter travels in an unquoted variable
filter=${FILTER:-*}
budget=${BUDGET:-60}
manifest=.device-deps/versions/manifest.json
# The DeepGEMM zero-length finding's smallest case (docs/findings/deepgemm-zero-length-request.md).
straddle='{"name":"zero-length-straddle","batch":3,"next_n":1,"heads":64,"head_dim":128,"block_size":64,"max_model_len":33537,"lengths":[33537,0,1]}'

first() {  # first DIR COMMAND...: COMMAND with DIR first on PYTHONPATH (subprocesses and workers too)
  local dir=$1; shift
  env PYTHONPATH="$dir:$PYTHONPATH" "$@"
}

manifest_list() {  # manifest_list EXPR: EXPR over the manifest `m`, printed space-separated
  python3 -c "import json, sys; m = json.load(open(sys.argv[1])); print(*($1))" "$manifest"
}

step 00-versions bash -c "cat $manifest; ls -l /tmp/versions"

# One archive per distinct DeepGEMM tree; the manifest names the releases sharing it.
for archive in $(manifest_list "a['archive'] for a in m['deep_gemm_archives']"); do
  name=${archive%.tar.xz}
  dir=/tmp/versions/$name
  step "$name-backends" first "$dir" $dt backends --device cuda  # the report has no library: this names it
  step "$name" first "$dir" $dt run --device cuda --no-progress --backends deepgemm,deepgemm-flattened \
    --case-filter "$filter" --budget "$budget" --report "$out/$name.json"
  step "$name-straddle" first "$dir" $dt run --device cuda --no-progress --backends torch,deepgemm,deepgemm-flattened \
    --spec "$straddle" --report "$out/$name-straddle.json"
done

for version in $(manifest_list "r['vllm'] for r in m['vllm_releases'] if r['triton_decode']"); do
  step "vllm-triton-decode-$version-backends" first "/tmp/versions/vllm-$version" $dt backends --device cuda
  step "vllm-triton-decode-$version" first "/tmp/versions/vllm-$version" $dt run --device cuda --no-progress \
    --backends torch,vllm-triton-decode --case-filter "$filter" --budget "$budget" \
    --report "$out/vllm-triton-decode-$version.json"
done

# AITER: the pinned wheel (/tmp/site) and main. Both generations read one length per sequence, so the
# vllm#59420 scenario (B = 16, next_n = 3) runs on each as declared and fed the per-row table.
aiter=aiter-triton-stage1,aiter-triton-fused,aiter-triton-stage1-ragged,aiter-triton-fused-ragged
for version in pinned main; do
  dir=/tmp/site
  blocks="--block-sizes 1"  # 0.1.7.x takes a block-size-1 cache only; main's paged kernels take 64
  if [ "$version" = main ]; then dir=/tmp/versions/aiter-main; blocks="--block-sizes 64"; fi
  step "aiter-$version-backends" first "$dir" $dt backends --device cuda
  step "aiter-$version" first "$dir" $dt run --device cuda --no-progress --backends "torch,$aiter" \
    --case-filter "$filter" --budget "$budget" --report "$out/aiter-$version.json"
  scenario="--device cuda --no-progress --cases random --batch 16 --next-n 3 --count 1 --heads 64 --head-dim 128"
  step "aiter-$version-59420-per-sequence" first "$dir" $dt run $scenario $blocks \
    --backends torch,aiter-triton-stage1,aiter-triton-fused --report "$out/aiter-$version-59420-per-sequence.json"
  step "aiter-$version-59420-per-row" first "$dir" $dt run $scenario $blocks --encoding per-row \
    --backends aiter-triton-stage1,aiter-triton-fused --report "$out/aiter-$version-59420-per-row.json"
done
