#!/usr/bin/env bash
# What a device visit carries, prepared from the project root on a machine with network (the device has none):
#   .device-deps/deep_gemm.tgz   DeepGEMM 2.8.1 as vendored in the vllm 0.33.0 wheel (vllm/third_party/deep_gemm:
#                                a torch stable-ABI build that loads on the device's torch 2.11; its kernels are
#                                JIT-compiled there with nvcc)
#   .device-deps/aiter/          amd-aiter 0.1.7.post2.dev18's Python tree cut to aiter/ops/triton, its __init__.py
#                                files emptied (the real ones import ROCm-only modules), so that the portable Triton
#                                kernels import on an NVIDIA GPU
#   .device-deps/aiter-dist/     the same wheel's dist-info and aiter/_version.py, so importlib.metadata names the
#                                version on the device
#   .whl/                        wheels of what the device image's Python 3.12 lacks: pydantic and junitparser,
#                                which difftest needs, and pyinstrument
# All git-ignored. scripts/device_env.sh unpacks them on the device; docs/device-runs.md says what each step
# carries. Wheels are cached in $DIFFTEST_WHEEL_CACHE (default ~/.cache/difftest-wheels).
set -euo pipefail
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
AITER_VERSION=${AITER_VERSION:-0.1.7.post2.dev18}
deps=.device-deps
cache=${DIFFTEST_WHEEL_CACHE:-$HOME/.cache/difftest-wheels}
mkdir -p "$deps" "$cache"

extract() {  # extract WHEEL DEST PREFIX...: the members of WHEEL under any PREFIX (or named exactly) into DEST
  python3 - "$@" <<'PY'
import sys, zipfile
wheel, dest, *prefixes = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if any(n.startswith(p) for p in prefixes)])
PY
}

wheel() {  # wheel DIST VERSION FILE-PREFIX: the cached wheel's path, downloaded when missing
  ls "$cache/$3-$2"-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps "$1==$2" -d "$cache"
  ls "$cache/$3-$2"-*.whl | head -n 1
}

if [ ! -f "$deps/deep_gemm.tgz" ]; then
  tmp=$(mktemp -d)
  extract "$(wheel vllm "$VLLM_VERSION" vllm)" "$tmp" vllm/third_party/deep_gemm/
  tar czf "$deps/deep_gemm.tgz" -C "$tmp/vllm/third_party" deep_gemm
  rm -rf "$tmp"
fi
aiter_wheel=$(wheel amd-aiter "$AITER_VERSION" amd_aiter)
if [ ! -d "$deps/aiter/ops/triton" ]; then
  tmp=$(mktemp -d)
  extract "$aiter_wheel" "$tmp" aiter/
  find "$tmp/aiter" -mindepth 1 -maxdepth 1 ! -name ops ! -name __init__.py -exec rm -rf {} +
  find "$tmp/aiter/ops" -mindepth 1 -maxdepth 1 ! -name triton ! -name __init__.py -exec rm -rf {} +
  : > "$tmp/aiter/__init__.py"
  : > "$tmp/aiter/ops/__init__.py"
  rm -rf "$deps/aiter" && mv "$tmp/aiter" "$deps/aiter"
  rm -rf "$tmp"
fi
rm -rf "$deps/aiter-dist" && extract "$aiter_wheel" "$deps/aiter-dist" amd_aiter- aiter/_version.py
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --dest .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 \
  typing_extensions==4.16.0 typing_inspection==0.4.5 junitparser==5.0.3 pyinstrument==5.1.3
du -sh "$deps"/* .whl
