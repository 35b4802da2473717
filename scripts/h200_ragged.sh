#!/usr/bin/env bash
# DeepGEMM's ragged (prefill) MQA logits on the H200 (issue 32, item 2): the production-scale plan against the
# fast oracle, then the fast oracle's bench against DeepGEMM. The ragged operation is not wired into `difftest`
# yet, so both are plain Python drivers. One device call, under 8 minutes: the campaign stops starting cases
# after CAMPAIGN_BUDGET seconds (default 170), kills a case 90 s after it started and so ends within about
# budget + 110 s with its summary written (cut off at budget + 150 s); the bench is cut off at 140 s.
#
# Prepare here, from the project root: the team's dependency script (.device-deps/deep_gemm.tgz: vllm 0.33.0's
# vendored DeepGEMM 2.8.1) and bash scripts/prepare_device.sh (.whl: pydantic). On the device, from the project
# root, carry [".device-deps", ".whl"]:
#   bash scripts/h200_ragged.sh
# Writes reports/h200/ragged/: campaign/ (plan.json, results.jsonl, summary.md, child.log, cases/ of failing
# cases small enough to replay), campaign.txt and bench.txt (the commands' output), bench.md and bench.json.
set -uo pipefail
out=reports/h200/ragged
mkdir -p "$out/campaign"
source scripts/device_env.sh
budget=${CAMPAIGN_BUDGET:-170}
{ echo "\$ python3 scripts/ragged_campaign.py --out $out/campaign --budget $budget --case-timeout 90"; echo;
  timeout -k 10 $((budget + 150)) python3 scripts/ragged_campaign.py --out "$out/campaign" --budget "$budget" \
    --case-timeout 90 2>&1
  echo "exit status: $?"; } | tee "$out/campaign.txt" | tail -n 40
{ echo "\$ python3 bench/ragged_oracle.py --out $out/bench"; echo;
  timeout -k 10 140 python3 bench/ragged_oracle.py --out "$out/bench" 2>&1
  echo "exit status: $?"; } | tee "$out/bench.txt" | tail -n 20
