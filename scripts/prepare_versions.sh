#!/usr/bin/env bash
# The version axis for the GPU device machine, from the project root (after scripts/prepare_device.sh:
# this adds, it replaces nothing there). Writes .device-deps/versions/ (git-ignored):
#   deep_gemm-<vllm>.tar.xz  DeepGEMM as vendored in each vllm release wheel (VLLM_VERSIONS, default
#                            0.30.0 .. 0.34.0), one archive per distinct tree
#   vllm-<vllm>/             the file holding vLLM's Triton decode indexer kernel, per release having it
#   aiter-main/              AITER's Triton paged MQA logits files at the HEAD of AITER_GIT_DIR
#   manifest.json            every entry, its source wheel (sha256) or commit, and its size
# Wheels come from $DIFFTEST_WHEEL_CACHE (default ~/.cache/difftest-wheels), downloaded when missing.
# Device side: scripts/device_env.sh unpacks each entry into /tmp/versions/<name>/, and a version is
# chosen by putting that directory first on PYTHONPATH (docs/versions.md).
set -euo pipefail
python3 "$(dirname "$0")/prepare_versions.py"
du -sh .device-deps/versions/* | sort -k2
