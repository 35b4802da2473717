#!/usr/bin/env bash
# The field backends' files for the GPU machine (no network there), from the project root; after the
# team's dependency script and scripts/prepare_versions.sh (this adds, it replaces nothing):
#   .device-deps/field/   scripts/prepare_field_deps.py: the kernel files the field backends load, one folder
#                         per release (vllm-0.33.0, vllm-0.34.0, sglang-0.5.23, flag_gems-5.0.2,
#                         flashinfer-0.7.2.post1) plus manifest.json; about 0.5 MB, from the wheel cache
#                         (DIFFTEST_WHEEL_CACHE) or the index
#   .device-tilelang/     with --tilelang only: tilelang-0.1.12-site.tar.xz, tilelang 0.1.12 (the release
#                         sglang 0.5.23 pins) and the Python 3.12 wheels it needs, installed into one folder
#                         (39.6 MB). It does not fit under the device's 64 MiB carry beside .device-deps
#                         (about 43 MB with the version axis), so it travels in a call of its own:
#                         carry [".device-deps/field", ".device-tilelang", ".whl"] (README of reports/h200/field).
set -euo pipefail
python3 "$(dirname "$0")/prepare_field_deps.py" .device-deps/field

if [ "${1:-}" = --tilelang ]; then
  out=.device-tilelang/tilelang-0.1.12-site.tar.xz
  if [ ! -f "$out" ]; then
    site=$(mktemp -d)
    # Pinned: tilelang's own pin of apache-tvm-ffi (<= 0.1.11) and z3-solver (< 4.15.5); the rest as
    # resolved on 2026-12-04. torch-c-dlpack-ext is optional and ships builds up to torch 2.9 only.
    python3 -m pip install -q --no-deps --target "$site" --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      tilelang==0.1.12 apache-tvm-ffi==0.1.11 z3-solver==4.15.4.0 ml-dtypes==0.7.0 cloudpickle==3.1.3 \
      psutil==7.2.2 tqdm==4.70.1
    # Not needed to compile or run a kernel: another backend's sources, console scripts. (tvm_ffi's
    # libtvm_ffi_testing.so stays: apache-tvm-ffi 0.1.11's core links it.)
    rm -rf "$site/tilelang/src/ascend" "$site/bin"
    # pip --target writes the libz3.so symlink as a second copy of the 22 MB library.
    if cmp -s "$site/z3/lib/libz3.so" "$site/z3/lib/libz3.so.4.15"; then
      ln -sf libz3.so.4.15 "$site/z3/lib/libz3.so"
    fi
    mkdir -p .device-tilelang
    tar cJf "$out.partial" -C "$site" . && mv "$out.partial" "$out"
    rm -rf "$site"
  fi
fi
du -sh .device-deps/field .device-tilelang 2>/dev/null || true
