#!/usr/bin/env bash
# The operations other than paged logits through `difftest run --op` on the H200: ragged logits on every
# ragged backend that loads (DeepGEMM's at production shapes through its envelope) and top-k on every top-k
# backend that loads, each at the device's scale; a short fuzz of each. Run from the project root on the GPU
# machine:  PYTHONPATH=. bash scripts/h200_ops.sh
# Writes reports/h200/ops/{ragged,topk}.{json,txt}, fuzz-*.{json,txt}, bundles under repro/, and README.md.
set -u
out=reports/h200/ops
mkdir -p "$out"
py=${PYTHON:-python3}
run() {  # name, then the difftest arguments
  local name=$1; shift
  echo "== difftest $*" | tee "$out/$name.txt"
  timeout 900 "$py" -m difftest "$@" 2>&1 | tee -a "$out/$name.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$out/$name.txt"
}
run ragged run --op ragged-logits --device cuda --budget 420 --report "$out/ragged.json" \
  --repro-dir "$out/repro/ragged"
run topk run --op topk --device cuda --budget 300 --report "$out/topk.json" --repro-dir "$out/repro/topk"
run fuzz-ragged fuzz --op ragged-logits --device cuda --budget 120s --report "$out/fuzz-ragged.json" \
  --repro-dir "$out/repro/fuzz-ragged"
run fuzz-topk fuzz --op topk --device cuda --budget 120s --report "$out/fuzz-topk.json" \
  --repro-dir "$out/repro/fuzz-topk"
cat > "$out/README.md" <<MD
# Operations on the H200 (scripts/h200_ops.sh)

Command: \`PYTHONPATH=. bash scripts/h200_ops.sh\` from the project root, $(date -u +%F).
Each \`*.txt\` is one command's table and failure blocks (its first line is the command); each \`*.json\` the
report. \`ragged\`: \`difftest run --op ragged-logits --device cuda\` (every ragged backend that loads, each on
its envelope at production scale); \`topk\`: \`difftest run --op topk --device cuda\`; \`fuzz-*\`: 120 s
campaigns. Bundles of failures under repro/ (\`difftest replay BUNDLE\`).
MD
