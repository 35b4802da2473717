#!/usr/bin/env bash
# One visit to the GPU device: every command whose output backs a claim under reports/h200/.
# Prepare here with scripts/prepare_device.sh, then on the device, from the repo root (carry
# .device-deps): bash scripts/h200_session.sh OUTDIR
# Writes OUTDIR/<step>.txt (the command line, then its output) and OUTDIR/<step>.json reports.
set -uo pipefail
out=${1:?usage: h200_session.sh OUTDIR}
mkdir -p "$out"
source scripts/device_env.sh
big="--block-sizes 64 --heads 64 --head-dim 128"

step 00-environment bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_capability())"'
step 01-backends $dt backends --device cuda
step 02-suite-bs64 $dt run --device cuda --no-progress --next-n 1,2,3,4 $big --count 4 --report "$out/02-suite-bs64.json"
step 03-suite-bs1 $dt run --device cuda --no-progress --next-n 1,2,3,4 --block-sizes 1 --heads 64 --head-dim 128 --count 2 --report "$out/03-suite-bs1.json"
step 04-long-context $dt run --device cuda --no-progress --cases random --batch 64 --max-model-len 131072 --next-n 1,2,4 $big --count 1 --report "$out/04-long-context.json"
step 05-vllm59420-declared $dt run --device cuda --no-progress --cases random --batch 16 --next-n 3 $big --count 1 --backends torch,aiter-triton-stage1,aiter-triton-fused,deepgemm-flattened --report "$out/05-vllm59420-declared.json"
step 06-vllm59420-per-row $dt run --device cuda --no-progress --cases random --batch 16 --next-n 3 $big --count 1 --backends aiter-triton-stage1,aiter-triton-fused --encoding per-row --report "$out/06-vllm59420-per-row.json"
step 07-native-vs-flattened python3 bench/deepgemm_native_vs_flattened.py --batch 40 --next-n 2 --context 120000 --repeats 50 --json "$out/07-native-vs-flattened.json"
# The plugin comes from PYTEST_PLUGINS (scripts/device_env.sh): the image cannot `pip install -e .`.
step 08-pytest python3 -m pytest -q -p no:cacheprovider tests
step 08b-pytest-gpu-marked python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests
step 09-oracle-vs-loop python3 bench/oracle_vs_loop.py --quick --device cuda
step 10-diag-deepgemm-long python3 scripts/diag_deepgemm_long.py --launches 3
spec='{"name":"random-mtp2-edges-bs64","batch":64,"next_n":2,"heads":64,"head_dim":128,"block_size":64,"max_model_len":131072,"length_dist":"edges"}'
step 11-deepgemm-long-shrink bash -c "$dt run --device cuda --no-progress --backends deepgemm --spec '$spec' --seed 4000 --repro-dir /tmp/r11; $dt shrink /tmp/r11/deepgemm--random-mtp2-edges-bs64-s4000 --seconds 150 --out $out/11-shrunk"
step 12-deepgemm-edges $dt run --device cuda --no-progress --cases edges --next-n 1,2,4 $big --backends torch,deepgemm,deepgemm-flattened --report "$out/12-deepgemm-edges.json"
# The zero-length finding's smallest case at the indexer's shape: [S, 0, 1], S = 131 * 256 + 1 on 132 SMs
# (docs/findings/deepgemm-zero-length-request.md); torch on the same case as the control.
straddle='{"name":"zero-length-straddle","batch":3,"next_n":1,"heads":64,"head_dim":128,"block_size":64,"max_model_len":33537,"lengths":[33537,0,1]}'
step 13-zero-length-straddle $dt run --device cuda --no-progress --backends torch,deepgemm,deepgemm-flattened \
  --spec "$straddle" --report "$out/13-zero-length-straddle.json"
# --gpus on the one GPU there is: the spread run's machinery and its per-result GPU record, against the
# same run without --gpus, verdict for verdict (issue 6; a second GPU was never lent).
gpus_args="--device cuda --no-progress --cases edges --next-n 1,2 $big --backends torch,deepgemm,deepgemm-flattened"
step 14-gpus-1 bash -c "$dt run $gpus_args --gpus 1 --report $out/14-gpus-1.json; $dt run $gpus_args --report $out/14-one-process.json;
  python3 scripts/same_verdicts.py $out/14-one-process.json $out/14-gpus-1.json"
