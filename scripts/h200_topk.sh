#!/usr/bin/env bash
# The top-k backends on the H200 (the lead runs it; each step fits one 10-minute device call). From the
# project root on the device, after `bash scripts/prepare_topk_deps.sh` here:
#
#   1. carry [".device-deps/topk/carry-small"]:  bash scripts/h200_topk.sh setup        (~1 min: unpack, pip wheels)
#   2. carry [".device-deps/topk/carry-vllm"]:   bash scripts/h200_topk.sh unpack-vllm  (~1 min)
#   3. no carry (machine still warm):            bash scripts/h200_topk.sh build        (FlashInfer's and SGLang's
#      JIT builds, bounded at 570 s: on a 2-core CPU machine topk.cu took 271 s and cub_topk.cu 671 s, SGLang's two
#      modules 17-18 s each; the device's cores build FlashInfer's four sources in parallel under ninja. Run it
#      again if it times out: what finished is cached under ~/.cache/flashinfer and ~/.cache/tvm-ffi)
#   4. no carry:                                 bash scripts/h200_topk.sh run          (every top-k backend that loads
#      on every edge family at production scale, bounded at 570 s; writes reports/h200/topk/)
#
# Steps 2-4 need the machine that step 1 set up (the unpacked files live under .device-deps/topk/ there). The
# device lets an idle machine go within a minute, so two one-call forms exist (each under 10 minutes; the run
# writes reports/h200/topk/ with whatever loaded, the rest SKIP with the reason):
#   carry [".device-deps/topk/carry-vllm"]:   bash scripts/h200_topk.sh vllm   (unpack, run: vLLM's kernels;
#                                             the archive is 60.8 MiB and the call carries 64 MiB with the
#                                             working tree: remove reports/, docs/ and bench/ from the work
#                                             tree for that call, `git checkout -- reports docs bench` after)
#   carry [".device-deps/topk/carry-small"]:  bash scripts/h200_topk.sh jit    (setup, build within
#                                             BUILD_LIMIT=330 s, run within RUN_LIMIT=180 s: FlagGems, FlashInfer, SGLang)
#
# FlashInfer's top-k prebuilt here (`bash scripts/prepare_topk_deps.sh flashinfer-aot`: sm_90a, 15 MiB) skips its JIT
# build: carry ".device-deps/topk/flashinfer-aot" too and `setup` and `run` copy it into flashinfer/data/aot/, which
# FlashInfer loads before building anything (flashinfer/jit/env.py get_aot_artifacts), e.g. in one call
#   carry [".device-deps/topk/carry-small", ".device-deps/topk/flashinfer-aot"]:  bash scripts/h200_topk.sh setup &&
#     TAG=flashinfer BACKENDS=flashinfer-top-k-ragged bash scripts/h200_topk.sh run
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
    python3 -m pip install -q --no-index --no-deps --target "$deps/site" "$deps"/carry-small/whl/*.whl
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
