#!/usr/bin/env bash
# Device visit (issue 33): the mutation score on the H200 and DeepGEMM's metamorphic relations at a context no
# oracle is computed for. From the project root on the device, DeepGEMM importable (the lead's unpacked copy on
# PYTHONPATH, or .device-deps carried: scripts/device_env.sh unpacks it):
#   PYTHONPATH=/path/to/deep_gemm/parent:. bash scripts/h200_selftest.sh [OUTDIR]     (default reports/h200/selftest)
# Wall time: each step runs under `timeout` (SELFTEST_LIMIT, default 580 s: the paged plan took 118 s on the H200,
# the ragged mutants' production plan is not timed yet; FUZZ_ONLY_LIMIT; RELATIONS_LIMIT seconds): run the steps
# in separate device calls (ONLY=...), each under the 10-minute limit of one;
# FUZZ_BUDGET is the fuzz round after step 01's plan (default 90s); the score of a 5-minute campaign is step 03's
# (`ONLY=^03 FUZZ_ONLY_LIMIT=450`, a device call of its own).
# ONLY=regex runs a subset of the steps (00, 01, 02, 03). Outputs: a .txt per step (the command, what it printed,
# its exit status), small JSON summaries; no raw streams.
set -uo pipefail
out=${1:-reports/h200/selftest}
mkdir -p "$out"
if [ -d .device-deps ] && [ -f scripts/device_env.sh ]; then
  source scripts/device_env.sh  # unpacks the carried libraries, puts them and the repo on PYTHONPATH
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
fi
source scripts/device_steps.sh  # timed_step
dt="python3 -m difftest.cli"
FUZZ_BUDGET=${FUZZ_BUDGET:-90s}
SELFTEST_LIMIT=${SELFTEST_LIMIT:-580}
RELATIONS_LIMIT=${RELATIONS_LIMIT:-100}


timed_step 00-environment 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, triton; print(\"torch\", torch.__version__, \"triton\", triton.__version__, torch.cuda.get_device_capability())"
python3 -c "import deep_gemm; print(\"deep_gemm\", getattr(deep_gemm, \"__version__\", \"?\"), deep_gemm.__file__)" || echo "deep_gemm: not importable (step 02 will skip DeepGEMM)"'

summarise() {  # summarise FULL SCORE: the report's `selftest` section, run facts, and per case (its families, the
  # verdicts it gave, the reason of its first SKIP): what tells a miss from a case that never ran; the results
  # themselves stay out (many MB)
  [ -f "$1" ] || return 0
  python3 - "$1" "$2" <<'EOF'
import collections, json, sys
report = json.load(open(sys.argv[1]))
cases = {}
for r in report["results"]:
    case = cases.setdefault(r["case"], {"families": (r.get("reach") or {}).get("families", []),
                                        "verdicts": collections.Counter(), "skip": None})
    case["verdicts"][r["verdict"]] += 1
    if r["verdict"] == "SKIP" and case["skip"] is None:
        case["skip"] = r.get("reason")
run = {k: report["run"].get(k) for k in ("command", "seconds", "device", "gpu", "budget")}
json.dump(dict(report["selftest"], run=run, cases=cases), open(sys.argv[2], "w"), indent=1)
EOF
  rm -f "$1"
}

# 1. The score under `difftest run`'s defaults on cuda (the production-scale envelope plan, isolated workers,
#    the fused oracle, --repeat 2), then a fuzz round of FUZZ_BUDGET for the mutants still uncaught and the four
#    that must pass. The report's `selftest` section is the score; its results stay out (they are many MB).
timed_step 01-selftest "$SELFTEST_LIMIT" $dt selftest --device cuda --budget "$FUZZ_BUDGET" --report "$out/01-selftest.full.json"
summarise "$out/01-selftest.full.json" "$out/01-selftest-score.json"

# 3. The score of a fuzz campaign alone (--fuzz-only): no planned case, every paged mutant in a FUZZ_ONLY_BUDGET
#    campaign (default 5m), a catch by any family counting. The campaign is the paged mutants' alone (top-k and
#    ragged mutants have no fuzz round, and step 01 scores their plans): only they are named, so the step is the
#    campaign's time.
paged=$(python3 -c "from difftest.backends import mutants; from difftest.core.kinds import OperationKind
print(','.join(s.key for s in mutants.CATALOGUE if s.operation == OperationKind.PAGED_LOGITS))")
timed_step 03-fuzz-only "${FUZZ_ONLY_LIMIT:-450}" $dt selftest --device cuda --fuzz-only --budget "${FUZZ_ONLY_BUDGET:-5m}" \
  --mutants "$paged" --report "$out/03-fuzz-only.full.json"
summarise "$out/03-fuzz-only.full.json" "$out/03-fuzz-only-score.json"

# 2. DeepGEMM's relations at its declared longest context, 262144 tokens (the contract allows no more), with
#    no oracle at all (--oracle none): native and flattened DeepGEMM judged against each other, every
#    relation checked on both. Full requests, then one empty request inside the batch (the zero-length finding),
#    then 384 full requests: 100.7M keys, whose exact float64 oracle would need 105.6 GB for itself
#    (difftest.core.memory.torch_oracle_bytes) beside the 13.3 GB case and each kernel's copy of it.
if python3 -c "import deep_gemm" 2>/dev/null || python3 -c "import vllm.third_party.deep_gemm" 2>/dev/null; then
  for spec in '{"name":"long-full","batch":4,"next_n":2,"heads":64,"head_dim":128,"block_size":64,"max_model_len":262144,"length_dist":"full"}' \
              '{"name":"long-empty","lengths":[262144,0,131073,262144],"next_n":2,"heads":64,"head_dim":128,"block_size":64,"max_model_len":262144}' \
              '{"name":"exact-out-of-reach","batch":384,"next_n":2,"heads":64,"head_dim":128,"block_size":64,"max_model_len":262144,"length_dist":"full"}'; do
    name=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['name'])" "$spec")
    timed_step "02-relations-$name" "$RELATIONS_LIMIT" $dt run --device cuda --backends deepgemm,deepgemm-flattened \
      --oracle none --metamorphic --spec "$spec" --report "$out/02-relations-$name.json" --verbose
    rm -f "$out/02-relations-$name.jsonl"  # the stream repeats the report's two results
  done
else
  echo "SKIPPED 02-relations: deep_gemm is not importable here (put the unpacked DeepGEMM on PYTHONPATH)" \
    | tee "$out/02-relations-SKIPPED.txt"
fi
echo "outputs in $out"
