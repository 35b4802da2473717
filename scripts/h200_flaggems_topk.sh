#!/usr/bin/env bash
# FlagGems 5.0.2's bucket_sort_topk on the H200: one row's candidates landing in the next row's candidate list
# (docs/findings/flaggems-bucket-topk-candidate-overflow.md). From the project root on the device, with carry
# [".whl", ".device-deps/topk/carry-small"], in one call:
#
#   bash scripts/h200_topk.sh setup && bash scripts/h200_flaggems_topk.sh
#
# scripts/flaggems_topk_overlap.py --device cuda: random-k512 called twice (ids written past the list, whether
# the two sets differ), then REPEAT (default 50) calls each of the H200's random-k2048-s0 case and of 32 pairs
# of rows (a one-token window before a full window of 8192, k 2048; N(0, 1) and crowded values). Three shapes
# to autotune (about 15 s each): well under LIMIT (default 115 s). Writes reports/h200/flaggems-topk/.
set -uo pipefail
deps=.device-deps/topk
out=reports/h200/flaggems-topk
mkdir -p "$out"
export PYTHONPATH=$PWD/$deps/site:$PWD/$deps/carry-small/flag_gems-5.0.2:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
command="python3 scripts/flaggems_topk_overlap.py --device cuda --repeat ${REPEAT:-50}"
{ echo "\$ $command"; timeout "${LIMIT:-115}" $command 2>&1; echo "exit status: $?"; } | tee "$out/overlap.txt"
cat > "$out/README.md" <<EOF
# FlagGems bucket_sort_topk: candidate lists overlapping between rows, on the GPU

Command (project root, device, carry .whl and .device-deps/topk/carry-small):
\`bash scripts/h200_topk.sh setup && bash scripts/h200_flaggems_topk.sh\` (REPEAT=${REPEAT:-50}), run
$(date -u +%Y-%m-%dT%H:%MZ) on $(python3 -c "import torch; print(torch.cuda.get_device_name(), 'torch', torch.__version__)" 2>/dev/null).
\`overlap.txt\`: each case's autotuned config, the ids its first call wrote past the candidate list, how many of
the calls came out wrong and which rows (even rows of the pairs hold one token, odd rows the full window).
What it means: docs/findings/flaggems-bucket-topk-candidate-overflow.md.
EOF
