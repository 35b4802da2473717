#!/usr/bin/env bash
# The ragged (prefill) logits metamorphic relations on the H200, where DeepGEMM's sm90 ragged kernel runs
# (window-relative, tail unspecified) and AITER's pinned Triton kernel runs compiled, at production scale (the
# ragged plan's 16384 rows over 131072 keys among it): every ragged backend of the device, every relation, after
# the oracle (the fused Triton one) has judged each result.
#
# What to look for: deepgemm-ragged keeps all six relations wherever the oracle passes it (a FAIL(metamorphic)
# there is a finding, or a relation too strict for a kernel that schedules by shape: read its first position);
# aiter-triton-ragged breaks shift-keys on every case, random-full (FAIL(metamorphic), which the oracle passes)
# included, as it does on the CPU (docs/selftest.md, ragged logits relations); scale-q and permute-heads hold for
# both.
#
# From the project root on the device, .whl and .device-deps/deep_gemm.tgz and .device-deps/aiter* carried
# (scripts/device_env.sh installs the wheels and unpacks DeepGEMM and AITER); RUN_LIMIT seconds per
# step, default 560:
#   bash scripts/h200_ragged_relations.sh [OUTDIR]     (default reports/h200/ragged-relations)
# Writes OUTDIR/00-environment.txt, then per step the command, what it printed, its exit status and wall time
# (NN-*.txt) and its report (NN-*.json): 01-random (the fixed suite), 02-envelope (the production plan).
set -uo pipefail
out=${1:-reports/h200/ragged-relations}
mkdir -p "$out"
if [ -d .whl ] && [ -f scripts/device_env.sh ]; then
  source scripts/device_env.sh  # installs the carried wheels, puts them and the repo on PYTHONPATH
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
fi
source scripts/device_steps.sh  # timed_step
limit=${RUN_LIMIT:-560}


timed_step 00-environment 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
python3 -c "import torch, triton; print(\"torch\", torch.__version__, \"triton\", triton.__version__, torch.cuda.get_device_capability())"'

timed_step 01-random "$limit" python3 -m difftest.cli run --op ragged-logits --device cuda --cases random --metamorphic \
  --report "$out/01-random.json" --overwrite
timed_step 02-envelope "$limit" python3 -m difftest.cli run --op ragged-logits --device cuda --metamorphic \
  --report "$out/02-envelope.json" --overwrite
