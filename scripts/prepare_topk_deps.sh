#!/usr/bin/env bash
# The compiled top-k kernels' files for the GPU machine, from the project root. Writes .device-deps/topk/
# (git-ignored) from the release wheels in $DIFFTEST_WHEEL_CACHE (default ~/.cache/difftest-wheels; each
# downloaded with `pip download --no-deps` when missing), in two carries of at most 64 MiB each:
#
#   carry-small/  (about 20 MB; carry with the first call of `scripts/device_visit.sh topk-setup`)
#     flag_gems-5.0.2/                  flag_gems/fused/DSA/bin_topk.py and flag_gems/utils/triton_version_utils.py
#                                       (no flag_gems/__init__.py: the adapter loads the file by path), VERSION
#     sglang-0.5.23-topk/               sglang/kernels/jit/csrc/{elementwise/fast_topk.cuh,deepseek_v4/topk_v2.cuh}
#                                       and sglang/kernels/jit/include/** (the JIT top-k sources)
#     flashinfer-0.7.2.post1.tar.xz     FlashInfer's Python package without data/, plus the top-k JIT sources
#                                       (data/csrc/{topk.cu,cub_topk.cu,flashinfer_topk_binding.cu,
#                                       flashinfer_fast_topk_clusters_binding.cu,topk_transform_checks.h,
#                                       tvm_ffi_utils.h}, data/include, data/cccl)
#     whl/                              apache-tvm-ffi 0.1.11, nvidia-ml-py, ninja (FlashInfer's and SGLang's JIT)
#   carry-vllm/   (60.8 MiB: a call of its own)
#     vllm_C-0.33.0.tar.xz              vllm/_C_stable_libtorch.abi3.so as vllm_C/_C_stable_libtorch.abi3.so
#
# `bash scripts/prepare_topk_deps.sh flashinfer-aot` also builds FlashInfer's top-k module here, ahead of time, for
# the H200 alone (its JIT build outlasts a 10-minute device call: cub_topk.cu alone took 671 s on 2 cores):
#   flashinfer-aot/topk/topk.so         flashinfer/jit/topk.py's JitSpec built by its own build() (FlashInfer's flags,
#                                       FLASHINFER_CUDA_ARCH_LIST=9.0a: sm_90a cubins only) with nvcc 13 from $CUDA_HOME
#                                       or PATH, MAX_JOBS=2 by default (1118 s on 2 cores; 15 MiB); build.ninja
#                                       beside it records the commands. `scripts/device_visit.sh topk-setup` copies the folder into
#                                       flashinfer/data/aot/, the first place FlashInfer looks before building
# That step needs .venv (`make .venv/bin/difftest`: FlashInfer reads its build flags through torch) and fetches the
# host Python's apache-tvm-ffi 0.1.11 (the carried wheel is for 3.12), nvidia-curand 10.4.0.35's curand headers when
# the toolkit lacks them, and links against an empty libcuda.so.1 stub when the toolkit has no stubs/libcuda.so.
#
# Idempotent: an entry already there is kept.
set -euo pipefail
step=${1:-}
case $step in
  ""|flashinfer-aot) ;;
  *) echo "usage: bash scripts/prepare_topk_deps.sh [flashinfer-aot]" >&2; exit 2 ;;
esac
out=.device-deps/topk
cache=${DIFFTEST_WHEEL_CACHE:-$HOME/.cache/difftest-wheels}
mkdir -p "$out/carry-small/whl" "$out/carry-vllm" "$cache"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

wheel() {  # wheel DIST VERSION GLOB: the cached wheel's path, downloaded first when missing
  local found
  found=$(ls "$cache"/$3 2>/dev/null | tail -1 || true)
  if [ -z "$found" ]; then
    python3 -m pip download -q --no-deps -d "$cache" "$1==$2" --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_28_x86_64 >&2 || python3 -m pip download -q --no-deps -d "$cache" "$1==$2" >&2
    found=$(ls "$cache"/$3 | tail -1)
  fi
  echo "$found"
}

archive() {  # archive DIR FILE: a reproducible .tar.xz of DIR's contents
  (cd "$1" && find . -type f | LC_ALL=C sort | tar --owner=0 --group=0 --mtime=@0 -cf - -T -) | xz -T0 -9 > "$2.part"
  mv "$2.part" "$2"
}

if [ ! -d "$out/carry-small/flag_gems-5.0.2" ]; then
  unzip -q -o "$(wheel flag-gems 5.0.2 'flag_gems-5.0.2-*.whl')" flag_gems/fused/DSA/bin_topk.py \
    flag_gems/utils/triton_version_utils.py -d "$tmp/fg"
  echo 5.0.2 > "$tmp/fg/VERSION" && mv "$tmp/fg" "$out/carry-small/flag_gems-5.0.2"
fi
if [ ! -d "$out/carry-small/sglang-0.5.23-topk" ]; then
  unzip -q -o "$(wheel sglang 0.5.23 'sglang-0.5.23-*.whl')" sglang/kernels/jit/csrc/elementwise/fast_topk.cuh \
    sglang/kernels/jit/csrc/deepseek_v4/topk_v2.cuh 'sglang/kernels/jit/include/*' -d "$tmp/sgl"
  mv "$tmp/sgl" "$out/carry-small/sglang-0.5.23-topk"
fi
if [ ! -f "$out/carry-small/flashinfer-0.7.2.post1.tar.xz" ]; then
  fi_whl=$(wheel flashinfer-python 0.7.2.post1 'flashinfer_python-0.7.2.post1-*.whl')
  unzip -q -o "$fi_whl" -x 'flashinfer/data/*' -d "$tmp/fi"
  unzip -q -o "$fi_whl" flashinfer/data/csrc/topk.cu flashinfer/data/csrc/cub_topk.cu \
    flashinfer/data/csrc/flashinfer_topk_binding.cu flashinfer/data/csrc/flashinfer_fast_topk_clusters_binding.cu \
    flashinfer/data/csrc/topk_transform_checks.h flashinfer/data/csrc/tvm_ffi_utils.h \
    'flashinfer/data/include/*' 'flashinfer/data/cccl/*' -d "$tmp/fi"
  archive "$tmp/fi" "$out/carry-small/flashinfer-0.7.2.post1.tar.xz"
fi
for spec in "apache-tvm-ffi 0.1.11 apache_tvm_ffi-0.1.11-*.whl" "nvidia-ml-py 13.615.71 nvidia_ml_py-13.615.71-*.whl" \
            "ninja 1.13.2 ninja-1.13.2-*.whl"; do
  set -- $spec
  ls "$out/carry-small/whl"/$3 >/dev/null 2>&1 || cp "$(wheel "$1" "$2" "$3")" "$out/carry-small/whl/"
done
if [ ! -f "$out/carry-vllm/vllm_C-0.33.0.tar.xz" ]; then
  unzip -q -o "$(wheel vllm 0.33.0 'vllm-0.33.0-*x86_64.whl')" vllm/_C_stable_libtorch.abi3.so -d "$tmp/vc"
  mkdir -p "$tmp/vcroot/vllm_C" && mv "$tmp/vc/vllm/_C_stable_libtorch.abi3.so" "$tmp/vcroot/vllm_C/"
  archive "$tmp/vcroot" "$out/carry-vllm/vllm_C-0.33.0.tar.xz"
fi
if [ "$step" = flashinfer-aot ] && [ ! -f "$out/flashinfer-aot/topk/topk.so" ]; then
  py=$PWD/.venv/bin/python
  [ -x "$py" ] || { echo "flashinfer-aot needs .venv: make .venv/bin/difftest" >&2; exit 1; }
  # the toolkit nvcc runs from (nvcc may be a wrapper script on PATH): its dry run names its own bin/
  toolkit=$(dirname "$("${CUDA_HOME:+$CUDA_HOME/bin/}nvcc" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 \
    | sed -n 's/^#\$ _HERE_=//p')")
  python3 -m tarfile -e "$out/carry-small/flashinfer-0.7.2.post1.tar.xz" "$tmp/fi"
  "$py" -m pip install -q --no-deps --target "$tmp/site" --find-links "$out/carry-small/whl" \
    apache-tvm-ffi==0.1.11 ninja==1.13.2 nvidia-ml-py==13.615.71
  # A toolkit of its own: $toolkit's entries, plus curand.h (topk.cu includes it) and a libcuda.so for FlashInfer's
  # `-lcuda` (the module calls no driver function, so the linker's --as-needed drops it: the .so needs libcudart.so.13)
  mkdir -p "$tmp/cuda/include" "$tmp/cuda/lib64"
  for entry in "$toolkit"/*; do
    case $(basename "$entry") in include|lib64) ;; *) ln -sfn "$entry" "$tmp/cuda/" ;; esac
  done
  ln -sf "$toolkit"/include/* "$tmp/cuda/include/" && ln -sf "$(readlink -f "$toolkit/lib64")"/* "$tmp/cuda/lib64/"
  if [ ! -f "$toolkit/include/curand.h" ]; then
    unzip -q -o "$(wheel nvidia-curand 10.4.0.35 'nvidia_curand-10.4.0.35-*.whl')" 'nvidia/cu13/include/curand*' \
      -d "$tmp/curand"
    ln -sf "$tmp"/curand/nvidia/cu13/include/curand*.h "$tmp/cuda/include/"
  fi
  if [ ! -e "$tmp/cuda/lib64/stubs/libcuda.so" ]; then
    mkdir -p "$tmp/cuda/lib64/stubs" && : > "$tmp/empty.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$tmp/cuda/lib64/stubs/libcuda.so" "$tmp/empty.c"
  fi
  start=$(date +%s)
  ( cd "$tmp" && FLASHINFER_WORKSPACE_BASE=$tmp/ws FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=$tmp/cuda \
      MAX_JOBS=${MAX_JOBS:-2} PATH=$tmp/site/bin:$PATH PYTHONPATH=$tmp/site:$tmp/fi "$py" -c "
from flashinfer.jit.topk import gen_topk_module
spec = gen_topk_module()
spec.build(verbose=True)
print(spec.jit_library_path)" ) > "$tmp/build.txt" 2>&1 || { tail -40 "$tmp/build.txt" >&2; exit 1; }
  echo "flashinfer-aot: topk.so built in $(( $(date +%s) - start )) s" >&2
  built=$(tail -1 "$tmp/build.txt")
  mkdir -p "$tmp/aot/topk" && cp "$built" "$(dirname "$built")/build.ninja" "$tmp/aot/topk/"
  mv "$tmp/aot" "$out/flashinfer-aot"
fi
du -sh "$out/carry-small" "$out/carry-vllm" $([ -d "$out/flashinfer-aot" ] && echo "$out/flashinfer-aot")
