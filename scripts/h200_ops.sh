#!/usr/bin/env bash
# The operations other than paged logits through `difftest run --op` on the H200: ragged logits on every
# ragged backend that loads (DeepGEMM's at production shapes through its envelope), top-k on every top-k
# backend that loads, each at the device's scale, the indexer end to end (DeepGEMM's paged logits composed
# with each top-k vLLM 0.33.0 runs after it, and with the torch top-k references); a short fuzz of ragged
# logits and top-k; the prefill indexer end to end (ragged logits, then top-k of each row's window). Run from the project root on the GPU machine:  PYTHONPATH=. bash scripts/h200_ops.sh
# Writes reports/h200/ops/{ragged,topk,indexer}.{json,txt}, fuzz-*.{json,txt}, bundles under repro/, README.md.
#
# Time: the whole script stays under 8 minutes. Each command has a --budget (no case is started after it)
# and a hard `timeout` (budget plus room for start-up, the DeepGEMM JIT build and the case in flight):
#   ragged 110 s / 140 s, topk 70 s / 95 s, indexer 80 s / 110 s, prefill-indexer 90 s / 120 s, fuzz-ragged
#   35 s / 60 s, fuzz-topk 35 s / 60 s = 420 s of budgets, at most 585 s of timeouts (under 10 minutes).
set -u
out=reports/h200/ops
mkdir -p "$out"
py=${PYTHON:-python3}
# The field's files (scripts/prepare_field_deps.sh), where carried: vLLM's and SGLang's ragged torch references.
field=$PWD/.device-deps/field
[ -d "$field" ] && export PYTHONPATH=$field/vllm-0.34.0:$field/sglang-0.5.23:${PYTHONPATH:-}
run() {  # name, hard timeout in seconds, then the difftest arguments (ONLY=regex runs the steps it matches)
  local name=$1 limit=$2; shift 2
  [[ $name =~ ${ONLY:-.} ]] || return 0
  echo "== difftest $*" | tee "$out/$name.txt"
  timeout "$limit" "$py" -m difftest "$@" 2>&1 | tee -a "$out/$name.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$out/$name.txt"
}
indexer=deepgemm+vllm-cooperative-topk,deepgemm+vllm-persistent-topk,deepgemm+vllm-top-k-per-row-decode
indexer=$indexer,deepgemm+torch-topk-vllm,deepgemm+torch-topk,deepgemm-flattened+vllm-persistent-topk
run ragged 140 run --op ragged-logits --device cuda --budget 110 --report "$out/ragged.json" \
  --repro-dir "$out/repro/ragged"
run topk 95 run --op topk --device cuda --budget 70 --report "$out/topk.json" --repro-dir "$out/repro/topk"
run indexer 110 run --op indexer --device cuda --backends "$indexer" --budget 80 --report "$out/indexer.json" \
  --repro-dir "$out/repro/indexer"
run prefill-indexer 120 run --op prefill-indexer --device cuda --budget 90 --report "$out/prefill-indexer.json" \
  --repro-dir "$out/repro/prefill-indexer"
run fuzz-ragged 60 fuzz --op ragged-logits --device cuda --budget 35s --report "$out/fuzz-ragged.json" \
  --repro-dir "$out/repro/fuzz-ragged"
run fuzz-topk 60 fuzz --op topk --device cuda --budget 35s --report "$out/fuzz-topk.json" \
  --repro-dir "$out/repro/fuzz-topk"
cat > "$out/README.md" <<MD
# Operations on the H200 (scripts/h200_ops.sh)

Command: \`PYTHONPATH=. bash scripts/h200_ops.sh\` from the project root, $(date -u +%F).
Each \`*.txt\` is one command's table and failure blocks (its first line is the command); each \`*.json\` the
report. \`ragged\`: \`difftest run --op ragged-logits --device cuda\` (every ragged backend that loads, each on
its envelope at production scale, 110 s budget); \`topk\`: \`difftest run --op topk --device cuda\` (70 s);
\`indexer\`: \`difftest run --op indexer --device cuda --backends $indexer\` (80 s: DeepGEMM's paged logits, then
each top-k, judged by the selected set at k = 2048 beside the logits stage's -inf mask); \`prefill-indexer\`: \`difftest
run --op prefill-indexer --device cuda\` (90 s: each ragged logits backend, then top-k of each row's window); \`fuzz-*\`: 35 s
campaigns. A command that reached its budget says which cases it did not start; one killed by its hard
timeout ends with exit 124 (its stream, \`*.jsonl\`, keeps every result before). Bundles of failures under
repro/ (\`difftest replay BUNDLE\`).
MD
