#!/usr/bin/env bash
# The field backends on the H200 (issue 31): vLLM's Step5 kernel (both callers), sglang's torch reference
# and TileLang kernel, FlashInfer (its reference; the kernel must SKIP on sm90 with its reason), DeepGEMM
# on its own and on FlagGems' schedule, and DeepGEMM 0.34.0's bf16 logits: envelope runs, a schedule
# comparison (plain and under memcheck) and `difftest fuzz` campaigns.
#
# Prepare here, from the project root: the team's dependency script (.device-deps/deep_gemm.tgz),
# bash scripts/prepare_device.sh (.whl), bash scripts/prepare_versions.sh (.device-deps/versions: the
# deep_gemm-0.34.0 tree) and bash scripts/prepare_field_deps.sh --tilelang.
# On the device, from the project root, one call per letter (each under 10 minutes; ONLY=regex picks steps):
#   ONLY='^a' bash scripts/h200_field.sh /tmp/field; tar czf $OUT/field-a.tgz -C /tmp field
# a-e carry [".device-deps", ".whl"]; f carries [".device-deps/field", ".device-tilelang", ".whl"] (TileLang,
# 40 MB, does not fit beside .device-deps). Order of value: a (Step5), b (FlagGems' schedule), e (fuzz),
# f (TileLang), c (DeepGEMM 0.34.0, sglang's reference), d (FlashInfer's reference).
# Writes OUTDIR/<step>.txt (the command, its output, its exit status: scripts/device_env.sh `step`) and
# OUTDIR/raw/ (JSON reports, streams, bundles: not committed). A step's failure never stops the next one;
# each is cut off by `timeout` so that a call ends inside its 10 minutes. RUN_BUDGET (default 150 s) is
# when a run starts no more cases; FUZZ_BUDGET (default 5m) the campaign's length.
set -uo pipefail
out=${1:?usage: h200_field.sh OUTDIR}
mkdir -p "$out/raw"
source scripts/device_env.sh
field=$PWD/.device-deps/field
run_budget=${RUN_BUDGET:-150}
# Every field release on the path: each backend finds its own file (difftest.backends.carried).
export PYTHONPATH=$field/vllm-0.34.0:$field/sglang-0.5.23:$field/flag_gems-5.0.2:$field/flashinfer-0.7.2.post1:$PYTHONPATH
dg034=/tmp/versions/deep_gemm-0.34.0  # scripts/device_env.sh unpacks it from .device-deps/versions
tilelang=/tmp/tilelang-site

first() {  # first DIR COMMAND...: COMMAND with DIR first on PYTHONPATH (workers inherit it)
  local dir=$1; shift
  env PYTHONPATH="$dir:$PYTHONPATH" "$@"
}

run() {  # run NAME BACKENDS BUDGET [ARGS...]: an envelope run (cut off 150 s after its budget), its report under raw/
  local name=$1 backends=$2 budget=$3; shift 3
  timeout -k 20 $((budget + 150)) $dt run --device cuda --no-progress --backends "$backends" --budget "$budget" \
    --report "$out/raw/$name.json" --stream "$out/raw/$name.jsonl" --overwrite "$@"
}

run_first() {  # run_first DIR NAME BACKENDS BUDGET [ARGS...]: run with DIR first on PYTHONPATH
  local dir=$1; shift
  PYTHONPATH="$dir:$PYTHONPATH" run "$@"
}

# TileLang 0.1.12 and its dependencies, unpacked once per machine (call f's carry).
if [ -f .device-tilelang/tilelang-0.1.12-site.tar.xz ] && mkdir "$tilelang" 2>/dev/null; then
  python3 -m tarfile -e .device-tilelang/tilelang-0.1.12-site.tar.xz "$tilelang"
fi

# a: what is here; the Step5 kernel as both callers use it (the 0.33.0 file is the same bytes: named only).
step a0-environment bash -c "nvidia-smi -L; python3 -c 'import torch, triton; print(torch.__version__, \
triton.__version__, torch.cuda.get_device_name())'; cat $field/manifest.json; ls /tmp/versions /tmp/site $tilelang 2>&1"
step a1-backends $dt backends --device cuda
step a2-step5 run a2-step5 vllm-step5,vllm-step5-paired "$run_budget"
step a3-step5-0.33.0 first "$field/vllm-0.33.0" $dt backends --device cuda

# b: DeepGEMM 2.8.1 (vllm 0.33.0's) on its own schedule and on FlagGems', timed; the schedules compared.
step b1-deepgemm-flaggems run b1-deepgemm-flaggems deepgemm,deepgemm-flaggems-schedule "$run_budget" --time 5
step b2-schedules timeout -k 10 100 python3 scripts/field_schedules.py
step b3-schedules-memcheck timeout -k 10 130 compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 scripts/field_schedules.py --small

# c: DeepGEMM from vllm 0.34.0's tree (bf16 logits); sglang's torch reference.
step c1-deepgemm-0.34.0 run_first "$dg034" c1-deepgemm-0.34.0 \
  deepgemm,deepgemm-bf16-logits,deepgemm-flaggems-schedule "$run_budget" --time 5
step c2-sglang-torch-ref run c2-sglang-torch-ref sglang-torch-ref 120

# d: FlashInfer's torch reference (a per-block loop: slow at these sizes) and the kernel's SKIP.
step d1-flashinfer run d1-flashinfer flashinfer-ref,flashinfer "$run_budget"

# e: the fuzz campaign over every sm90 field backend and DeepGEMM.
# SIGTERM at FUZZ_LIMIT (default 480 s) still writes the report, marked incomplete: keep it under the call's
# own limit, or the campaign ends with nothing printed (what happened to a 4-minute one beside five other jobs).
step e1-fuzz timeout -k 20 "${FUZZ_LIMIT:-480}" $dt fuzz --device cuda --budget "${FUZZ_BUDGET:-5m}" \
  --backends vllm-step5,vllm-step5-paired,deepgemm,deepgemm-flaggems-schedule \
  --repro-dir "$out/raw/fuzz-bundles" --stream "$out/e1-fuzz.jsonl" --report "$out/e1-fuzz.json" \
  --shrink-seconds 20 ${FUZZ_TIMEOUT:+--timeout "$FUZZ_TIMEOUT"}
# The torch references (SGLang's, FlashInfer's per-block loop) in a campaign of their own: a reference's
# production-scale case is slow, and the kernels' campaign must not wait on it.
step e2-fuzz-references timeout -k 20 "${FUZZ_LIMIT:-480}" $dt fuzz --device cuda --budget "${FUZZ_BUDGET:-5m}" \
  --backends sglang-torch-ref,flashinfer-ref --repro-dir "$out/raw/fuzz-ref-bundles" --stream "$out/e2-fuzz.jsonl" \
  --report "$out/e2-fuzz.json" --shrink-seconds 20

# DeepGEMM 0.34.0's bf16 logits beside its fp32 entry point, the vllm 0.34.0 tree first on the path (the 0.33.0
# build takes no logits_dtype).
step e3-fuzz-bf16 first "$dg034" timeout -k 20 "${FUZZ_LIMIT:-480}" $dt fuzz --device cuda --budget "${FUZZ_BUDGET:-5m}" \
  --backends deepgemm-bf16-logits,deepgemm --repro-dir "$out/raw/fuzz-bf16-bundles" --stream "$out/e3-fuzz.jsonl" \
  --report "$out/e3-fuzz.json" --shrink-seconds 20

# f: TileLang (its own carry).
step f1-tilelang-backends first "$tilelang" $dt backends --device cuda
step f2-tilelang run_first "$tilelang" f2-tilelang sglang-tilelang "$run_budget"
step f3-tilelang-fuzz first "$tilelang" timeout -k 20 "${TILELANG_FUZZ_LIMIT:-200}" $dt fuzz --device cuda --budget "${TILELANG_FUZZ_BUDGET:-90s}" \
  --backends sglang-tilelang --repro-dir "$out/raw/tilelang-bundles" --stream "$out/f3-tilelang-fuzz.jsonl" \
  --report "$out/f3-tilelang-fuzz.json"
