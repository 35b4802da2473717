#!/usr/bin/env bash
# The compiled and Triton top-k backends on the H200 (reports/h200/topk/README.md holds what this wrote). From the
# project root on the device, after `bash scripts/prepare_topk_deps.sh` (and its `flashinfer-aot` step) here.
# Every form needs difftest's own wheels (.whl: pydantic); the device lets an idle machine go within a minute,
# so a form that needs two carries runs as two calls back to back on the warm machine.
#
#   setup        unpack FlashInfer's tree, install the JIT's wheels and .whl's, put the prebuilt FlashInfer module
#                in place (carry .whl, .device-deps/topk/carry-small, .device-deps/topk/flashinfer-aot)
#   unpack-vllm  unpack vLLM 0.33.0's _C (carry .device-deps/topk/carry-vllm: 60.8 MiB, which with the working
#                tree leaves no room for .whl; remove reports/, docs/ and bench/ from the work tree for that call,
#                `git checkout -- reports docs bench` after, then run with .whl carried in the next call)
#   build        SGLang's JIT builds (about 20 s), FlashInfer's when no prebuilt module is there (its cub_topk.cu
#                alone takes longer than a device call)
#   run          TAG, BACKENDS: the family table, `difftest run --op topk` defaults and a FUZZ_BUDGET campaign,
#                under reports/h200/topk/TAG/
#   vllm, jit    unpack-vllm + run of vLLM's four kernels; setup + build + run of FlagGems', SGLang's and FlashInfer's
#
# As run on 2026-12-04: `unpack-vllm` (carry-vllm), then in the next call `pip install --target
# .device-deps/topk/site .whl/*.whl` and `TAG=vllm BACKENDS=... bash scripts/h200_topk.sh run` (carry .whl);
# `setup` + `TAG=flashinfer BACKENDS=flashinfer-top-k-ragged ... run` (carry .whl, carry-small, flashinfer-aot).
set -uo pipefail
deps=.device-deps/topk
out=reports/h200/topk
mkdir -p "$out"
export PYTHONPATH=$PWD/$deps/site:$PWD/$deps/carry-small/flag_gems-5.0.2:$PWD/$deps/flashinfer:$PWD${PYTHONPATH:+:$PYTHONPATH}
export DIFFTEST_TOPK_DEPS=$PWD/$deps PYTHONUNBUFFERED=1
[ -d "$deps/carry-small/sglang-0.5.23-topk" ] && ln -sfn carry-small/sglang-0.5.23-topk "$deps/sglang-0.5.23-topk"
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")}
[ -d "$deps/cuda_home/include" ] && [ "${1:-}" != setup ] && export CUDA_HOME=$PWD/$deps/cuda_home

install_flashinfer_aot() {  # the carried prebuilt modules where FlashInfer looks first, when both are here
  [ -d "$deps/flashinfer-aot" ] && [ -d "$deps/flashinfer/flashinfer" ] || return 0
  mkdir -p "$deps/flashinfer/flashinfer/data/aot"
  cp -r "$deps/flashinfer-aot"/. "$deps/flashinfer/flashinfer/data/aot/"
  echo "FlashInfer AOT modules: $(cd "$deps/flashinfer-aot" && ls -d */ | tr -d / | tr '\n' ' ')"
}

VLLM_TOPK=vllm-top-k-per-row-prefill,vllm-top-k-per-row-decode,vllm-persistent-topk,vllm-cooperative-topk
JIT_TOPK=flaggems-bucket-topk,sglang-jit-topk-v2-ragged,sglang-jit-fast-topk,flashinfer-top-k-ragged

case "${1:-}" in
  setup)
    mkdir -p "$deps/flashinfer" "$deps/site"
    python3 -m tarfile -e "$deps/carry-small/flashinfer-0.7.2.post1.tar.xz" "$deps/flashinfer"
    # the JIT's wheels, and difftest's own dependencies the image lacks (pydantic: carry .whl with every form)
    python3 -m pip install -q --no-index --no-deps --target "$deps/site" "$deps"/carry-small/whl/*.whl \
      $(ls .whl/*.whl 2>/dev/null)
    install_flashinfer_aot
    # FlashInfer's topk.cu includes curand.h, which the CUDA toolkit image may lack; torch's cu13 wheels ship it
    # (nvidia/cu13/include). Then $deps/cuda_home is the toolkit with those headers added to its include/.
    if [ ! -f "$CUDA_HOME/include/curand.h" ]; then
      curand=$(python3 -c "import glob, site; print(next(iter(glob.glob(site.getsitepackages()[0] + '/nvidia/*/include/curand.h')), ''))")
      if [ -n "$curand" ]; then
        mkdir -p "$deps/cuda_home/include"
        for entry in "$CUDA_HOME"/*; do [ "$(basename "$entry")" = include ] || ln -sfn "$entry" "$deps/cuda_home/"; done
        ln -sf "$CUDA_HOME"/include/* "$deps/cuda_home/include/" && ln -sf "$(dirname "$curand")"/curand*.h "$deps/cuda_home/include/"
      fi
      echo "curand.h: ${curand:-not found}"
    fi
    ;;
  unpack-vllm)
    python3 -m tarfile -e "$deps/carry-vllm/vllm_C-0.33.0.tar.xz" "$deps"
    ls -la "$deps/vllm_C"
    ;;
  build)
    timeout "${BUILD_LIMIT:-570}" python3 scripts/topk_campaign.py --build 2>&1 | tee "$out/build.txt"
    ;;
  run)  # BACKENDS (comma-separated, default every top-k backend) and TAG name the outputs under $out/TAG/:
        # the family table (topk_campaign.py, each case twice), `difftest run --op topk` defaults and a
        # FUZZ_BUDGET campaign, each under its own hard timeout
    dir=$out/${TAG:-all} && mkdir -p "$dir"
    install_flashinfer_aot
    chosen=${BACKENDS:-$(python3 -c "import sys; sys.path[:0]=['scripts']
from topk_campaign import backends; print(','.join(backends()))")}
    timeout "${TABLE_LIMIT:-150}" python3 scripts/topk_campaign.py --out "$dir" --backends "$chosen" 2>&1 | tee "$dir/table.txt"
    { echo "\$ difftest run --op topk --device cuda --backends $chosen --budget ${RUN_BUDGET:-90}"
      timeout $((${RUN_BUDGET:-90} + 60)) python3 -m difftest.cli run --op topk --device cuda --backends "$chosen" \
        --budget "${RUN_BUDGET:-90}" --report "$dir/run.json" --repro-dir "$dir/repro/run" 2>&1
      echo "exit status: $?"; } | tee "$dir/run.txt"
    { echo "\$ difftest fuzz --op topk --device cuda --backends $chosen --budget ${FUZZ_BUDGET:-120s}"
      timeout "${FUZZ_LIMIT:-200}" python3 -m difftest.cli fuzz --op topk --device cuda --backends "$chosen" \
        --budget "${FUZZ_BUDGET:-120s}" --report "$dir/fuzz.json" --repro-dir "$dir/repro/fuzz" 2>&1
      echo "exit status: $?"; } | tee "$dir/fuzz.txt"
    ;;
  vllm)  # one call, carry [".device-deps/topk/carry-vllm"]: vLLM's compiled top-k kernels, unpacked and run
    bash "$0" unpack-vllm && TAG=vllm BACKENDS=${BACKENDS:-$VLLM_TOPK} bash "$0" run
    ;;
  jit)  # one call, carry [".device-deps/topk/carry-small"]: FlagGems' Triton top-k and the JIT builds, then a run
    bash "$0" setup && BUILD_LIMIT=${BUILD_LIMIT:-300} bash "$0" build
    TAG=jit BACKENDS=${BACKENDS:-$JIT_TOPK} bash "$0" run
    ;;
  *)
    echo "usage: bash scripts/h200_topk.sh setup|unpack-vllm|build|run|vllm|jit" >&2; exit 2 ;;
esac
