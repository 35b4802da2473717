#!/usr/bin/env bash
# vLLM's indexer paths on a CPU machine with network: a venv with the pinned vllm wheel and its
# dependencies (torch 2.14; the venv comes to 9.7 GB), difftest in it, then every command whose output backs a
# claim under reports/cpu/vllm-0.33.0/. From the repo root:
#   bash scripts/vllm_cpu_session.sh OUTDIR        (VENV=/path reuses a venv made by an earlier run)
# Writes OUTDIR/<step>.txt (the command line, its output, its exit status) and the run's JSON report.
set -uo pipefail
out=${1:?usage: vllm_cpu_session.sh OUTDIR}
venv=${VENV:-.vllm-venv}
mkdir -p "$out"
if [ ! -x "$venv/bin/difftest" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "vllm==0.33.0" pytest hypothesis pytest-xdist
  "$venv/bin/pip" install -q --no-deps amd-aiter==0.1.7.post2.dev18 -e .
fi

step() {  # step NAME COMMAND...: record the command and its output in $out/NAME.txt
  local name=$1; shift
  { echo "\$ $*"; echo; "$@" 2>&1; local status=$?; echo; echo "exit status: $status"; } > "$out/$name.txt"
  tail -n 15 "$out/$name.txt"
}

step 00-environment "$venv/bin/python" -c "import platform, torch, vllm; print(platform.platform(), torch.__version__, vllm.__version__)"
step 01-backends "$venv/bin/difftest" backends
step 02-run-torch-ref "$venv/bin/difftest" run --no-progress --backends torch,vllm-torch-ref --cases all --count 2 \
  --report "$out/02-run-torch-ref.json"
step 03-run-torch-ref-token-interleaved "$venv/bin/difftest" run --no-progress --backends vllm-torch-ref --cases all \
  --count 2 --layout token-interleaved --report "$out/03-run-torch-ref-token-interleaved.json"
step 04-pytest "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs tests/difftest/backends/test_vllm.py
