#!/usr/bin/env bash
# The ragged (prefill) logits mutants of `difftest selftest` at production scale on the H200: the two that must
# pass pass the production ragged plan (16384 rows over 131072 keys among it), every other one is caught by the
# family its catalogue entry names, the two production-only ones (32-bit key offset, 32-bit row offset) by
# keys-2^31-bytes and logits-2^31-elements, which the CPU's SMALL scale leaves out. No library is needed: the
# mutants are torch, the oracle the fused Triton one.
#
# From the project root on the device, .whl carried (the wheels the image lacks: pydantic and what it needs;
# scripts/device_env.sh installs them); SELFTEST_LIMIT seconds, default 560:
#   bash scripts/h200_ragged_mutants.sh [OUTDIR]     (default reports/h200/ragged-mutants)
# Writes OUTDIR/00-environment.txt, 01-selftest.txt (the command, what it printed, its exit status and wall
# time) and 01-score.json (the report's `selftest` section; the paged results it would hold are none here).
set -uo pipefail
out=${1:-reports/h200/ragged-mutants}
mkdir -p "$out"
if [ -d .whl ] && [ -f scripts/device_env.sh ]; then
  source scripts/device_env.sh  # installs the carried wheels, puts them and the repo on PYTHONPATH
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
fi
source scripts/device_steps.sh  # timed_step
limit=${SELFTEST_LIMIT:-560}


timed_step 00-environment 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
python3 -c "import torch, triton; print(\"torch\", torch.__version__, \"triton\", triton.__version__, torch.cuda.get_device_capability())"'

mutants=$(python3 -c "from difftest.backends import mutants; from difftest.core.kinds import OperationKind
print(','.join(s.key for s in mutants.CATALOGUE if s.operation == OperationKind.RAGGED_LOGITS))")
timed_step 01-selftest "$limit" python3 -m difftest.cli selftest --device cuda --mutants "$mutants" \
  --report "$out/01-selftest.full.json"
if [ -f "$out/01-selftest.full.json" ]; then
  python3 -c "import json, sys; json.dump(json.load(open(sys.argv[1]))['selftest'], open(sys.argv[2], 'w'), indent=1)" \
    "$out/01-selftest.full.json" "$out/01-score.json" && rm -f "$out/01-selftest.full.json"
fi
