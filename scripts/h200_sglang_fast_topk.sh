#!/usr/bin/env bash
# SGLang 0.5.23's JIT fast_topk on the H200: the smallest case of docs/findings/sglang-fast-topk-crowded-bin.md,
# its control and the crowded-bin cases, through difftest's adapter (stock kernel, 3 launches each) and through a
# copy of the kernel patched in /tmp (its 4096-entry candidate list raised to 24576; no SGLang source is kept),
# each judged by difftest's oracle and compared with the CPU port (scripts/sglang_fast_topk_port.py).
# `difftest run --spec` is a paged-logits option, so scripts/sglang_fast_topk_gpu.py builds the cases and calls
# the adapter itself. One device call, cut off at 150 s (three JIT builds of ~20 s each, run side by side).
#
# From the project root on the device, carry [".whl", ".device-deps/topk/carry-small"] (scripts/prepare_topk_deps.sh
# here). It installs the carried wheels when `bash scripts/h200_topk.sh setup` has not run on this machine:
#   bash scripts/h200_sglang_fast_topk.sh
# Writes reports/h200/sglang-fast-topk/run.txt (the output) and results.json (one object per case).
set -uo pipefail
deps=.device-deps/topk
out=reports/h200/sglang-fast-topk
mkdir -p "$out"
export PYTHONPATH=$PWD/$deps/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export DIFFTEST_TOPK_DEPS=$PWD/$deps PYTHONUNBUFFERED=1
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")}
[ -d "$deps/cuda_home/include" ] && export CUDA_HOME=$PWD/$deps/cuda_home  # h200_topk.sh setup's, when made
[ -d "$deps/carry-small/sglang-0.5.23-topk" ] && ln -sfn carry-small/sglang-0.5.23-topk "$deps/sglang-0.5.23-topk"
if [ ! -d "$deps/site/tvm_ffi" ]; then  # the part of h200_topk.sh's setup this kernel needs (tvm-ffi, ninja)
  python3 -m pip install -q --no-index --no-deps --target "$deps/site" "$deps"/carry-small/whl/*.whl \
    $(ls .whl/*.whl 2>/dev/null)  # difftest's own dependencies the image lacks (pydantic): carry .whl too
fi
{ echo "\$ python3 scripts/sglang_fast_topk_gpu.py --out $out"; echo
  timeout -k 10 "${LIMIT:-150}" python3 scripts/sglang_fast_topk_gpu.py --out "$out" 2>&1
  echo "exit status: $?"; } | tee "$out/run.txt"
