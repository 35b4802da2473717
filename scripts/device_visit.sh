#!/usr/bin/env bash
# The GPU device visits: every command whose output backs a claim under reports/, as named steps.
#
#   bash scripts/device_visit.sh STEP [STEP ...] OUTDIR   run the steps in order; step S writes OUTDIR/S/
#   bash scripts/device_visit.sh --list                     the steps: what each carries and runs
#
# On the device, from the project root, after scripts/prepare_device.sh here (docs/device-runs.md: what to
# prepare, what to carry, each step and the claim folder it refreshes). Every sub-step writes
# OUTDIR/STEP/NAME.txt: the command line, what it printed, its exit status (scripts/device_steps.sh);
# ONLY=regex runs the sub-steps whose names match, since one device call is 10 minutes. A step's failure
# never stops the next one. RUN_BUDGET (seconds) and FUZZ_BUDGET (a duration) shape the steps' runs and
# campaigns; each step has its own default.
set -uo pipefail

# name | carry (besides the working tree) | what it runs. The table --list prints and docs/device-runs.md
# describes; each name is a step_<name> function below (dashes as underscores).
STEPS=(
  "production|.device-deps .whl|difftest run --device cuda: the default run, the envelope plan at production scale"
  "suite|.device-deps .whl|the fixed suites at production shapes, long context, vllm#59420, native vs flattened, the pytest suite, the zero-length diagnosis and shrink, --gpus 1"
  "isolation|.device-deps .whl|planted crashing kernels isolated, under compute-sanitizer, killed and resumed; isolation's cost"
  "fuzz|.device-deps .whl|difftest fuzz --device cuda over torch and DeepGEMM native and flattened (FUZZ_BUDGET, default 5m)"
  "fuzz-budget|.device-deps .whl|difftest fuzz by root cause within its budget, a planted kernel beside DeepGEMM; the first repro line pasted"
  "explain|.device-deps .whl|failures that explain themselves at production scale (AITER, DeepGEMM, planted kernels, a traceback)"
  "planted-edges|.device-deps .whl|planted kernels that only the alignment and offset edge families reach, and their control"
  "side-by-side|.device-deps .whl|eleven correct workers and a planted one side by side at production sizes: memory never a verdict"
  "selftest|.device-deps .whl|difftest selftest --device cuda (the score, a fuzz-only score) and DeepGEMM's relations past the exact oracle"
  "ragged-mutants|.whl|the ragged logits mutants of difftest selftest on the production ragged plan"
  "ragged-relations|.device-deps .whl|difftest run --op ragged-logits --metamorphic on DeepGEMM's and AITER's ragged kernels"
  "ragged|.device-deps .whl|DeepGEMM's ragged logits campaign (scripts/ragged_campaign.py) and the fused ragged oracle's bench"
  "ops|.device-deps .whl|difftest run --op ragged-logits|topk|indexer|prefill-indexer --device cuda, and short fuzz campaigns"
  "op-isolation|.device-deps .whl|run --op topk|ragged-logits|indexer isolated and in process: the same verdicts; crashing top-k kernels"
  "topk-setup|.whl .device-deps/topk/carry-small .device-deps/topk/flashinfer-aot|unpack FlashInfer, install the JIT's wheels, place the prebuilt FlashInfer module"
  "topk-unpack-vllm|.device-deps/topk/carry-vllm|unpack vLLM 0.33.0's compiled _C (60.8 MiB: no room for .whl in this call)"
  "topk-build|.whl .device-deps/topk/carry-small|SGLang's (and FlashInfer's) JIT top-k builds"
  "topk|.whl (and what the backends need)|the top-k family table, difftest run --op topk and a fuzz campaign for BACKENDS, under TAG/"
  "topk-vllm|.device-deps/topk/carry-vllm|topk-unpack-vllm, then topk for vLLM's four compiled top-k kernels (TAG vllm)"
  "topk-jit|.device-deps/topk/carry-small|topk-setup and topk-build, then topk for FlagGems', SGLang's and FlashInfer's (TAG jit)"
  "flaggems-topk|.whl .device-deps/topk/carry-small|FlagGems' bucket top-k candidate lists overlapping between rows (after topk-setup)"
  "sglang-fast-topk|.whl .device-deps/topk/carry-small|SGLang's JIT fast_topk on its crowded-bin case, stock and patched, against the CPU port"
  "field|.device-deps .whl (f: .device-deps/field .device-tilelang .whl)|the field backends: vLLM Step5, FlagGems' schedule, DeepGEMM 0.34.0, SGLang, FlashInfer, TileLang (sub-steps a-f)"
  "versions|.device-deps .whl|the version axis: DeepGEMM per vllm release, vLLM's Triton decode kernel, AITER pinned and main"
  "matrix|.device-deps .whl|difftest matrix run for the sm90 cells of reports/matrix/difftest.toml (CELLS=regex)"
  "bench|.device-deps .whl|bench/: the fused oracle against DeepGEMM, a fuzz batch's breakdown, the fuzz rate"
  "gpu-tests|.device-deps .whl|python3 -m pytest -m gpu tests: every GPU-marked test"
)

list_steps() {  # the table, one step a line
  local entry name carry what
  printf '%-18s %-60s %s\n' step carry runs
  for entry in "${STEPS[@]}"; do
    IFS='|' read -r name carry what <<< "$entry"
    printf '%-18s %-60s %s\n' "$name" "$carry" "$what"
  done
}

is_step() {  # is_step NAME: status 0 when NAME is in the table
  local entry
  for entry in "${STEPS[@]}"; do [[ ${entry%%|*} == "$1" ]] && return 0; done
  return 1
}

environment() {  # 00-environment: the GPU, the driver, torch and Triton
  step 00-environment bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, triton; print(\"torch\", torch.__version__, \"triton\", triton.__version__, torch.cuda.get_device_capability())"'
}

first() {  # first DIR COMMAND...: COMMAND (a command or a function) with DIR first on PYTHONPATH, its
  # subprocesses and workers too
  local dir=$1; shift
  PYTHONPATH="$dir:$PYTHONPATH" "$@"
}

streamed() {  # streamed FILE: the result lines of a JSONL stream (0 before it exists)
  local n
  n=$(grep -c '"result"' "$1" 2>/dev/null)
  echo "${n:-0}"
}

big="--block-sizes 64 --heads 64 --head-dim 128"  # the DeepSeek indexer's shape
straddle='{"name":"zero-length-straddle","batch":3,"next_n":1,"heads":64,"head_dim":128,"block_size":64,"max_model_len":33537,"lengths":[33537,0,1]}'

# ------------------------------------------------------------------------------------------ paged logits

step_production() {  # reports/h200/production
  environment
  step 01-default-run $dt run --device cuda ${RUN_BUDGET:+--budget "$RUN_BUDGET"} --report "$out/01-default.json"
}

step_suite() {  # reports/h200/aiter-mask, deepgemm-zero-length, native-vs-flattened, oracle-vs-loop, gpus-1
  environment
  step 01-backends $dt backends --device cuda
  step 02-suite-bs64 $dt run --device cuda --no-progress --next-n 1,2,3,4 $big --count 4 --report "$out/02-suite-bs64.json"
  step 03-suite-bs1 $dt run --device cuda --no-progress --next-n 1,2,3,4 --block-sizes 1 --heads 64 --head-dim 128 \
    --count 2 --report "$out/03-suite-bs1.json"
  step 04-long-context $dt run --device cuda --no-progress --cases random --batch 64 --max-model-len 131072 \
    --next-n 1,2,4 $big --count 1 --report "$out/04-long-context.json"
  local scenario="--device cuda --no-progress --cases random --batch 16 --next-n 3 $big --count 1"
  step 05-vllm59420-declared $dt run $scenario --backends torch,aiter-triton-stage1,aiter-triton-fused,deepgemm-flattened \
    --report "$out/05-vllm59420-declared.json"
  step 06-vllm59420-per-row $dt run $scenario --backends aiter-triton-stage1,aiter-triton-fused --encoding per-row \
    --report "$out/06-vllm59420-per-row.json"
  step 07-native-vs-flattened python3 bench/deepgemm_native_vs_flattened.py --batch 40 --next-n 2 --context 120000 \
    --repeats 50 --json "$out/07-native-vs-flattened.json"
  step 08-pytest python3 -m pytest -q -p no:cacheprovider tests
  step 08b-pytest-gpu-marked python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests
  step 09-oracle-vs-loop python3 bench/oracle_vs_loop.py --quick --device cuda
  step 10-diag-deepgemm-long python3 scripts/diag_deepgemm_long.py --launches 3
  local long='{"name":"random-mtp2-edges-bs64","batch":64,"next_n":2,"heads":64,"head_dim":128,"block_size":64,"max_model_len":131072,"length_dist":"edges"}'
  step 11-deepgemm-long-shrink bash -c "$dt run --device cuda --no-progress --backends deepgemm --spec '$long' --seed 4000 \
    --repro-dir /tmp/r11; $dt shrink /tmp/r11/deepgemm--random-mtp2-edges-bs64-s4000 --seconds 150 --out $out/11-shrunk"
  step 12-deepgemm-edges $dt run --device cuda --no-progress --cases edges --next-n 1,2,4 $big \
    --backends torch,deepgemm,deepgemm-flattened --report "$out/12-deepgemm-edges.json"
  # The zero-length finding's smallest case at the indexer's shape, torch as the control.
  step 13-zero-length-straddle $dt run --device cuda --no-progress --backends torch,deepgemm,deepgemm-flattened \
    --spec "$straddle" --report "$out/13-zero-length-straddle.json"
  # --gpus on the one GPU there is, against the same run in one process, verdict for verdict.
  local spread="--device cuda --no-progress --cases edges --next-n 1,2 $big --backends torch,deepgemm,deepgemm-flattened"
  step 14-gpus-1 bash -c "$dt run $spread --gpus 1 --report $out/14-gpus-1.json; $dt run $spread --report $out/14-one-process.json
    python3 scripts/same_verdicts.py $out/14-one-process.json $out/14-gpus-1.json"
}

kill_and_resume() {  # kill_and_resume RUN...: RUN in its own session, SIGKILLed after 5 streamed results, then --resume
  local stream=$out/05-kill-resume.jsonl pid waited=0
  rm -f "$stream"
  setsid "$@" --stream "$stream" > "$out/05-killed-run.txt" 2>&1 &  # the run, its fork server and workers: one group
  pid=$!
  while [ "$(streamed "$stream")" -lt 5 ] && kill -0 "$pid" 2>/dev/null && [ $waited -lt 1200 ]; do
    sleep 0.5; waited=$((waited + 1))
  done
  kill -KILL -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  echo "results in the stream after the kill: $(streamed "$stream")"
  "$@" --stream "$stream" --resume "$stream" --report "$out/05-kill-resume.json"
  python3 - "$out/05-kill-resume.json" <<'PY'
import collections, json, sys
results = json.load(open(sys.argv[1]))["results"]
pairs = collections.Counter((r["backend"], r["case"]) for r in results)
print(f"final report: {len(results)} results, {len(pairs)} distinct (backend, case), "
      f"repeated: {[p for p, n in pairs.items() if n > 1]}")
PY
}

step_isolation() {  # reports/h200/isolation: tests/gpu_broken_backends.py's kernels beside torch and DeepGEMM
  local bin
  for bin in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [ -x "$bin/compute-sanitizer" ] && PATH=$PATH:$bin && break; done
  local kernels="--backend-module tests.gpu_broken_backends:TritonGood --backend-module tests.gpu_broken_backends:TritonOobRead"
  kernels="$kernels --backend-module tests.gpu_broken_backends:TritonIllegalWrite"
  # Two indexer cases (next_n 1 and 2, native for DeepGEMM on sm90): few, as every failure is replayed under memcheck.
  local cases="--cases random --count 1 --next-n 1,2 $big --max-model-len 1024 --case-filter random-mtp?-uniform-*"
  local run02="$dt run --device cuda --isolate --no-progress $cases --backends torch,deepgemm $kernels --repeat 3 --timeout 300"
  environment
  step 00-sanitizer bash -c 'compute-sanitizer --version || echo "compute-sanitizer: not found"'
  step 01-backends $dt backends --device cuda
  step 02-isolated-memcheck $run02 --sanitize memcheck --report "$out/02-isolated-memcheck.json"
  step 03-oob-read-sanitize-all $dt run --device cuda --isolate --no-progress --cases random --count 1 --next-n 2 $big \
    --max-model-len 1024 --backend-module tests.gpu_broken_backends:TritonOobRead --sanitize memcheck --sanitize-all \
    --report "$out/03-oob-read-sanitize-all.json"
  step 04-not-isolated $dt run --device cuda --no-isolate --no-progress $cases --backends torch,deepgemm $kernels \
    --report "$out/04-not-isolated.json"
  step 05-kill-resume kill_and_resume $run02
  step 06-isolation-cost python3 bench/isolation_cost.py --device cuda --backends torch,deepgemm --count 2 \
    --json "$out/06-isolation-cost.json"
  step 06b-isolation-cost-default python3 bench/isolation_cost.py --device cuda --repeats 2 \
    --backends torch,deepgemm,deepgemm-flattened,aiter-triton-stage1,aiter-triton-fused,aiter-triton-stage1-ragged,aiter-triton-fused-ragged \
    --json "$out/06b-isolation-cost-default.json"
  step 07-pytest python3 -m pytest -q -p no:cacheprovider tests/difftest/engine/test_isolate.py \
    tests/difftest/engine/test_guards.py tests/difftest/engine/test_sanitize.py tests/difftest/workflows/test_fuzz_inputs.py
}

step_fuzz() {  # reports/h200/fuzz-5m (and fuzz, at FUZZ_BUDGET=150s)
  step 01-fuzz $dt fuzz --device cuda --budget "${FUZZ_BUDGET:-5m}" --backends torch,deepgemm,deepgemm-flattened \
    --repro-dir "$out/bundles" --stream "$out/01-fuzz.jsonl" --shrink-seconds "${SHRINK:-15}"
}

step_fuzz_budget() {  # reports/h200/fuzz-budget; the report and bundles (gigabytes) stay under /tmp
  local work=/tmp/fuzz-budget
  mkdir -p "$work"
  step 01-fuzz $dt fuzz --device cuda --budget "${FUZZ_BUDGET:-3m}" --shrink-seconds "${SHRINK:-45}" \
    --backends torch,deepgemm --backend-module tests.user_backends:window_one_short \
    --repro-dir "$work/bundles" --report "$work/01-fuzz.json" --no-progress
  step 02-signatures python3 - "$work/01-fuzz.json" "$work/first-repro" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["run"]
campaign, budget = run["campaign"], run["budget"]
phases = campaign["phases"]
print(f"budget {budget:g} s: total {phases['total']:.1f} s (cases {phases['cases']:.1f} s, shrinking "
      f"{phases['shrinking']:.1f} s); over the budget by {max(phases['total'] - budget, 0):.1f} s")
for sign in campaign["signatures"]:
    print(f"{sign['backend']}: {sign['verdict']} pattern={sign['pattern']} error={sign['error']}: "
          f"{sign['results']} results; also {[(a['pattern'], a['results']) for a in sign['also']]}")
    print(f"  variants: {json.dumps(sign['variants'])}")
    print(f"  repro: {sign['repro']}")
    print(f"  --device cuda in it: {sign['repro'] is None or '--device cuda' in sign['repro']}")
first = next((s["repro"] for s in campaign["signatures"] if s["repro"]), None)
open(sys.argv[2], "w").write(first.removeprefix("difftest ") if first else "")
PY
  # The first repro line as printed (`difftest` is `python3 -m difftest.cli` here): it must fail again.
  step 03-pasted bash -c "$dt \$(cat $work/first-repro) --no-progress"
}

step_explain() {  # reports/h200/explain: what each step should show is in its README
  local shapes="--device cuda --cases random --count 2 --heads 64 --head-dim 128 --max-model-len 8192 --no-progress"
  environment
  step 01-aiter-mirrored $dt run $shapes --next-n 2,3,4 --block-sizes 64 \
    --backends torch,aiter-triton-stage1,aiter-triton-fused --report "$out/01-aiter.json"
  step 02-deepgemm-topk $dt run $shapes --next-n 1,2,4 --block-sizes 64 --backends torch,deepgemm \
    --report "$out/02-deepgemm.json"
  step 03-planted $dt run $shapes --next-n 3 --block-sizes 64 --backends torch \
    --backend-module tests.user_backends:sequence_length_for_every_row \
    --backend-module tests.user_backends:mirrored_mtp_window --backend-module tests.user_backends:window_one_short \
    --report "$out/03-planted.json"
  step 04-traceback $dt run --device cuda --isolate --cases edges --case-filter 'length-one-*' --no-progress -v \
    --backends torch --backend-module tests.broken_backends:raises_nested --report "$out/04-traceback.json"
  step summary python3 - "$out" <<'PY'
import collections, json, pathlib, sys
for report in sorted(pathlib.Path(sys.argv[1]).glob("0*.json")):
    results = json.loads(report.read_text())["results"]
    print(f"== {report.name}")
    by_backend = collections.defaultdict(list)
    for r in results:
        by_backend[r["backend"]].append(r)
    for backend, rs in by_backend.items():
        relations = collections.Counter(
            json.dumps(r["comparison"]["explanation"]["relation"], sort_keys=True)
            for r in rs if r.get("comparison") and r["comparison"].get("explanation"))
        overlaps = [r["comparison"]["topk_overlap"] for r in rs if r.get("comparison")]
        print(f"{backend}: {dict(collections.Counter(r['verdict'] for r in rs))}; top-k overlap {overlaps}")
        for relation, n in relations.items():
            print(f"    {n} x {relation}")
        for r in [r for r in rs if r.get("traceback")][:2]:
            print(f"    traceback ends: {r['traceback'].splitlines()[-1]}")
PY
}

step_planted_edges() {  # reports/h200/planted-edges; FAMILIES=all runs the whole default plan in 01
  local planted="tests.gpu_broken_backends:TritonLastTileSpill,tests.gpu_broken_backends:TritonInt32BlockBase"
  local families="--case-filter unaligned-* --case-filter block-base-* --case-filter pool-* --case-filter max-model-len*"
  local chosen=$families
  [[ ${FAMILIES:-} == all ]] && chosen=""
  step 01-planted $dt run --device cuda --no-progress ${RUN_BUDGET:+--budget "$RUN_BUDGET"} --backends "$planted" $chosen \
    --report "$out/01-planted.json" --overwrite
  step 02-control $dt run --device cuda --no-progress ${RUN_BUDGET:+--budget "$RUN_BUDGET"} \
    --backends tests.gpu_broken_backends:TritonGood $families --report "$out/02-control.json" --overwrite
}

memory_summary() {  # memory_summary REPORT: verdicts per backend, memory SKIPs and retries; 1 on an ERROR from memory
  python3 - "$1" <<'PY'
import collections, json, re, sys
report = json.load(open(sys.argv[1]))
results = report["results"]
memory = re.compile(r"out of memory|can't allocate memory|CUDA_ERROR_OUT_OF_MEMORY", re.IGNORECASE)
verdicts = collections.defaultdict(collections.Counter)
for r in results:
    verdicts[r["backend"]][r["verdict"]] += 1
for backend, counts in sorted(verdicts.items()):
    print(f"{backend:<24} " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())))
notes = [r for r in results if r.get("memory")]
print(f"results with a memory note: {len(notes)}; run alone: {sum(bool(r['memory']['alone']) for r in notes)}; "
      f"retried alone: {sum(bool(r['memory']['retried']) for r in notes)}")
skips = [r for r in results if r["verdict"] == "SKIP" and memory.search(r["reason"] or "")]
for r in skips:
    print(f"  memory SKIP: {r['backend']} on {r['case']}: {r['reason']}")
unnumbered = [r for r in skips if "needs about" not in r["reason"] or " free on " not in r["reason"]]
errors = [r for r in results if r["verdict"] in ("ERROR", "CRASH")]
for r in errors:
    print(f"  {r['verdict']}: {r['backend']} on {r['case']}: {r['reason']}")
from_memory = [r for r in errors if memory.search(r["reason"] or "")]
print(f"ERROR/CRASH from memory: {len(from_memory)}; memory SKIPs without their numbers: {len(unnumbered)}; "
      f"not started: {len(report['run'].get('not_started', []))}")
sys.exit(1 if from_memory or unnumbered else 0)
PY
}

step_side_by_side() {  # reports/h200/side-by-side: tests/side_by_side_backends.py's copies of one correct kernel
  local module=tests.side_by_side_backends copies ten
  copies=$(python3 -c "print(','.join(f'$module:Copy{i:02d}' for i in range(11)))")
  ten=$(python3 -c "print(','.join(f'$module:Copy{i:02d}' for i in range(10)))")
  local large="--case-filter logits-* --case-filter pool-* --case-filter random-b128* --case-filter max-model-len*"
  environment
  step 01-eleven $dt run --device cuda --no-progress ${RUN_BUDGET:+--budget "$RUN_BUDGET"} --backends "$copies" \
    --report "$out/01-eleven.json"
  step 01-eleven-summary memory_summary "$out/01-eleven.json"
  step 02-ten-and-planted $dt run --device cuda --no-progress $large --backends "$ten,$module:Planted" \
    --report "$out/02-ten-and-planted.json"
  step 02-ten-and-planted-summary memory_summary "$out/02-ten-and-planted.json"
}

selftest_summary() {  # selftest_summary FULL SCORE: the report's `selftest` section, run facts and per case what
  # tells a miss from a case that never ran; the results themselves (many MB) are removed
  [ -f "$1" ] || return 0
  python3 - "$1" "$2" <<'PY'
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
PY
  rm -f "$1"
}

mutants_of() {  # mutants_of OPERATION: the catalogue's mutant keys of one operation, comma-separated
  python3 -c "from difftest.backends import mutants; from difftest.core.kinds import OperationKind
print(','.join(s.key for s in mutants.CATALOGUE if s.operation == OperationKind.$1))"
}

step_selftest() {  # reports/h200/selftest: 01 and 03 each take a device call (ONLY=^01, ONLY=^03)
  environment
  # The score under run's defaults on cuda, then a FUZZ_BUDGET round for the mutants still uncaught.
  timed_step 01-selftest "${SELFTEST_LIMIT:-580}" $dt selftest --device cuda --budget "${FUZZ_BUDGET:-90s}" \
    --report "$out/01-selftest.full.json"
  selftest_summary "$out/01-selftest.full.json" "$out/01-selftest-score.json"
  # A fuzz campaign's score alone: every paged mutant, no planned case.
  timed_step 03-fuzz-only "${FUZZ_ONLY_LIMIT:-450}" $dt selftest --device cuda --fuzz-only \
    --budget "${FUZZ_ONLY_BUDGET:-5m}" --mutants "$(mutants_of PAGED_LOGITS)" --report "$out/03-fuzz-only.full.json"
  selftest_summary "$out/03-fuzz-only.full.json" "$out/03-fuzz-only-score.json"
  # DeepGEMM's relations at 262144 tokens with no oracle (--oracle none): full requests, an empty one inside the
  # batch, then 384 full requests, whose exact float64 oracle would need 105.6 GB.
  if ! python3 -c "import deep_gemm" 2>/dev/null && ! python3 -c "import vllm.third_party.deep_gemm" 2>/dev/null; then
    echo "SKIPPED 02-relations: deep_gemm is not importable here (carry .device-deps)" | tee "$out/02-relations-SKIPPED.txt"
    return 0
  fi
  local spec name
  for spec in '{"name":"long-full","batch":4,"next_n":2,"heads":64,"head_dim":128,"block_size":64,"max_model_len":262144,"length_dist":"full"}' \
              '{"name":"long-empty","lengths":[262144,0,131073,262144],"next_n":2,"heads":64,"head_dim":128,"block_size":64,"max_model_len":262144}' \
              '{"name":"exact-out-of-reach","batch":384,"next_n":2,"heads":64,"head_dim":128,"block_size":64,"max_model_len":262144,"length_dist":"full"}'; do
    name=$(python3 -c "import json, sys; print(json.loads(sys.argv[1])['name'])" "$spec")
    timed_step "02-relations-$name" "${RELATIONS_LIMIT:-100}" $dt run --device cuda --backends deepgemm,deepgemm-flattened \
      --oracle none --metamorphic --spec "$spec" --report "$out/02-relations-$name.json" --verbose
    rm -f "$out/02-relations-$name.jsonl"  # the stream repeats the report's two results
  done
}

# ------------------------------------------------------------------------------- ragged logits, operations

step_ragged_mutants() {  # the ragged mutants at production scale: the 32-bit offsets only keys-2^31-bytes reach
  environment
  timed_step 01-selftest "${SELFTEST_LIMIT:-560}" $dt selftest --device cuda --mutants "$(mutants_of RAGGED_LOGITS)" \
    --report "$out/01-selftest.full.json"
  [ -f "$out/01-selftest.full.json" ] && python3 -c "import json, sys
json.dump(json.load(open(sys.argv[1]))['selftest'], open(sys.argv[2], 'w'), indent=1)" \
    "$out/01-selftest.full.json" "$out/01-score.json" && rm -f "$out/01-selftest.full.json"
}

step_ragged_relations() {  # deepgemm-ragged should keep every relation; aiter-triton-ragged breaks shift-keys
  environment
  timed_step 01-random "${RUN_LIMIT:-560}" $dt run --op ragged-logits --device cuda --cases random --metamorphic \
    --report "$out/01-random.json" --overwrite
  timed_step 02-envelope "${RUN_LIMIT:-560}" $dt run --op ragged-logits --device cuda --metamorphic \
    --report "$out/02-envelope.json" --overwrite
}

step_ragged() {  # reports/h200/ragged: the campaign stops starting cases after CAMPAIGN_BUDGET seconds
  local budget=${CAMPAIGN_BUDGET:-170}
  timed_step campaign $((budget + 150)) python3 scripts/ragged_campaign.py --out "$out/campaign" --budget "$budget" \
    --case-timeout 90
  timed_step bench 140 python3 bench/ragged_oracle.py --out "$out/bench"
}

step_ops() {  # reports/h200/ops: each command has a --budget and a hard limit, under 8 minutes in all
  local indexer=deepgemm+vllm-cooperative-topk,deepgemm+vllm-persistent-topk,deepgemm+vllm-top-k-per-row-decode
  indexer=$indexer,deepgemm+torch-topk-vllm,deepgemm+torch-topk,deepgemm-flattened+vllm-persistent-topk
  local field=$PWD/.device-deps/field  # vLLM's and SGLang's ragged torch references, where carried
  [ -d "$field" ] && export PYTHONPATH=$field/vllm-0.34.0:$field/sglang-0.5.23:$PYTHONPATH
  topk_environment
  timed_step ragged 140 $dt run --op ragged-logits --device cuda --budget 110 --report "$out/ragged.json" \
    --repro-dir "$out/repro/ragged"
  timed_step topk 95 $dt run --op topk --device cuda --budget 70 --report "$out/topk.json" \
    --repro-dir "$out/repro/topk"
  timed_step indexer 110 $dt run --op indexer --device cuda --backends "$indexer" --budget 80 \
    --report "$out/indexer.json" --repro-dir "$out/repro/indexer"
  timed_step prefill-indexer 120 $dt run --op prefill-indexer --device cuda --budget 90 \
    --report "$out/prefill-indexer.json" --repro-dir "$out/repro/prefill-indexer"
  timed_step fuzz-ragged 60 $dt fuzz --op ragged-logits --device cuda --budget 35s \
    --report "$out/fuzz-ragged.json" --repro-dir "$out/repro/fuzz-ragged"
  timed_step fuzz-topk 60 $dt fuzz --op topk --device cuda --budget 35s --report "$out/fuzz-topk.json" \
    --repro-dir "$out/repro/fuzz-topk"
}

step_op_isolation() {  # reports/h200/op-isolation: the same verdicts isolated and in process
  local op
  environment
  for op in topk ragged-logits indexer; do
    step "$op-isolated" /usr/bin/time -f "wall %e s" $dt run --op "$op" --device cuda --cases random --isolate \
      --report "$out/$op-isolated.json"
    step "$op-in-process" /usr/bin/time -f "wall %e s" $dt run --op "$op" --device cuda --cases random --no-isolate \
      --report "$out/$op-in-process.json"
  done
  # A file, not stdin: the workers start by spawn, which imports the main module again from its path.
  cat > "$out/topk_crash.py" <<'PY'
import sys
from difftest.backends import torch_topk
from difftest.cli import main
from tests.broken_topk import Aborts, Sleeps
if __name__ == "__main__":
    for backend in (Aborts, Sleeps):
        torch_topk.TOPK_BACKENDS[backend.name] = backend
    sys.exit(main(["run", "--op", "topk", "--device", "cuda", "--cases", "random", "--timeout", "5", "--backends",
                   "aborts,sleeps,torch-topk", "--report", sys.argv[1], "-v"]))
PY
  step topk-crash python3 "$out/topk_crash.py" "$out/topk-crash.json"
  step summary python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def verdicts(path):
    return {(r["backend"], r["case"]): r["verdict"] for r in json.loads(path.read_text())["results"]}
for op in ("topk", "ragged-logits", "indexer"):
    inside, outside = out / f"{op}-isolated.json", out / f"{op}-in-process.json"
    if not (inside.exists() and outside.exists()):
        print(op, "missing report"); continue
    a, b = verdicts(inside), verdicts(outside)
    print(op, "same verdicts:", a == b)
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            print("  differs", key, a.get(key), b.get(key))
crash = out / "topk-crash.json"
if crash.exists():
    print("topk-crash:", sorted({(r["backend"], r["verdict"]) for r in json.loads(crash.read_text())["results"]}))
PY
}

# -------------------------------------------------------------------------------------------------- top-k

topk_deps=.device-deps/topk
VLLM_TOPK=vllm-top-k-per-row-prefill,vllm-top-k-per-row-decode,vllm-persistent-topk,vllm-cooperative-topk
JIT_TOPK=flaggems-bucket-topk,sglang-jit-topk-v2-ragged,sglang-jit-fast-topk,flashinfer-top-k-ragged

topk_environment() {  # the carried top-k trees on PYTHONPATH, the CUDA toolkit the JIT builds use
  export PYTHONPATH=$PWD/$topk_deps/site:$PWD/$topk_deps/carry-small/flag_gems-5.0.2:$PWD/$topk_deps/flashinfer:$PYTHONPATH
  export DIFFTEST_TOPK_DEPS=$PWD/$topk_deps
  [ -d "$topk_deps/carry-small/sglang-0.5.23-topk" ] && ln -sfn carry-small/sglang-0.5.23-topk "$topk_deps/sglang-0.5.23-topk"
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")}
  [ -d "$topk_deps/cuda_home/include" ] && CUDA_HOME=$PWD/$topk_deps/cuda_home  # topk-setup's, when made
  export CUDA_HOME
}

topk_wheels() {  # the JIT's carried wheels (apache-tvm-ffi, ninja), once per machine; device_env.sh installs .whl
  [ -d "$topk_deps/site/tvm_ffi" ] || [ ! -d "$topk_deps/carry-small/whl" ] && return 0
  python3 -m pip install -q --no-index --no-deps --target "$topk_deps/site" "$topk_deps"/carry-small/whl/*.whl
}

install_flashinfer_aot() {  # the carried prebuilt FlashInfer modules where FlashInfer looks first
  [ -d "$topk_deps/flashinfer-aot" ] && [ -d "$topk_deps/flashinfer/flashinfer" ] || return 0
  mkdir -p "$topk_deps/flashinfer/flashinfer/data/aot"
  cp -r "$topk_deps/flashinfer-aot"/. "$topk_deps/flashinfer/flashinfer/data/aot/"
  echo "FlashInfer AOT modules: $(cd "$topk_deps/flashinfer-aot" && ls -d */ | tr -d / | tr '\n' ' ')"
}

curand_home() {  # FlashInfer's topk.cu includes curand.h, which the image's toolkit may lack; torch's cu13 wheels
  # ship it: then $topk_deps/cuda_home is the toolkit with those headers added
  [ -f "$CUDA_HOME/include/curand.h" ] && return 0
  local curand entry
  curand=$(python3 -c "import glob, site; print(next(iter(glob.glob(site.getsitepackages()[0] + '/nvidia/*/include/curand.h')), ''))")
  echo "curand.h: ${curand:-not found}"
  [ -n "$curand" ] || return 0
  mkdir -p "$topk_deps/cuda_home/include"
  for entry in "$CUDA_HOME"/*; do [ "$(basename "$entry")" = include ] || ln -sfn "$entry" "$topk_deps/cuda_home/"; done
  ln -sf "$CUDA_HOME"/include/* "$topk_deps/cuda_home/include/" && ln -sf "$(dirname "$curand")"/curand*.h "$topk_deps/cuda_home/include/"
}

step_topk_setup() {
  topk_environment
  mkdir -p "$topk_deps/flashinfer" "$topk_deps/site"
  step unpack-flashinfer python3 -m tarfile -e "$topk_deps/carry-small/flashinfer-0.7.2.post1.tar.xz" "$topk_deps/flashinfer"
  step wheels topk_wheels
  step flashinfer-aot install_flashinfer_aot
  step curand curand_home
}

step_topk_unpack_vllm() {
  topk_environment
  step unpack-vllm bash -c "python3 -m tarfile -e $topk_deps/carry-vllm/vllm_C-0.33.0.tar.xz $topk_deps && ls -la $topk_deps/vllm_C"
}

step_topk_build() {
  topk_environment
  timed_step build "${BUILD_LIMIT:-570}" python3 scripts/topk_campaign.py --build
}

step_topk() {  # reports/h200/topk/TAG: BACKENDS (default every top-k backend) and TAG name the outputs
  local dir=$out/${TAG:-all} chosen
  mkdir -p "$dir"
  topk_environment
  topk_wheels
  install_flashinfer_aot
  chosen=${BACKENDS:-$(python3 -c "import sys; sys.path[:0] = ['scripts']
from topk_campaign import backends; print(','.join(backends()))")}
  out=$dir timed_step table "${TABLE_LIMIT:-150}" python3 scripts/topk_campaign.py --out "$dir" --backends "$chosen"
  out=$dir timed_step run $((${RUN_BUDGET:-90} + 60)) $dt run --op topk --device cuda --backends "$chosen" \
    --budget "${RUN_BUDGET:-90}" --report "$dir/run.json" --repro-dir "$dir/repro/run"
  out=$dir timed_step fuzz "${FUZZ_LIMIT:-200}" $dt fuzz --op topk --device cuda --backends "$chosen" \
    --budget "${FUZZ_BUDGET:-120s}" --report "$dir/fuzz.json" --repro-dir "$dir/repro/fuzz"
}

step_topk_vllm() {  # writes OUTDIR/topk/vllm, as `topk` with TAG=vllm does
  out=${out%/*}/topk && mkdir -p "$out"
  step_topk_unpack_vllm
  TAG=vllm BACKENDS=${BACKENDS:-$VLLM_TOPK} step_topk
}

step_topk_jit() {  # writes OUTDIR/topk/jit, as `topk` with TAG=jit does
  out=${out%/*}/topk && mkdir -p "$out/jit"
  step_topk_setup
  out=$out/jit BUILD_LIMIT=${BUILD_LIMIT:-300} step_topk_build
  TAG=jit BACKENDS=${BACKENDS:-$JIT_TOPK} step_topk
}

step_flaggems_topk() {  # reports/h200/flaggems-topk: three shapes to autotune, about 15 s each
  topk_environment
  timed_step overlap "${LIMIT:-115}" python3 scripts/flaggems_topk_overlap.py --device cuda --repeat "${REPEAT:-50}"
}

step_sglang_fast_topk() {  # reports/h200/sglang-fast-topk: three JIT builds of ~20 s, side by side
  topk_environment
  topk_wheels
  timed_step run "${LIMIT:-150}" python3 scripts/sglang_fast_topk_gpu.py --out "$out"
}

# --------------------------------------------------------------------------------- the field and versions

field_run() {  # field_run NAME BACKENDS BUDGET [ARGS...]: an envelope run (cut off 150 s after its budget), under raw/
  local name=$1 backends=$2 budget=$3; shift 3
  timeout -k 20 $((budget + 150)) $dt run --device cuda --no-progress --backends "$backends" --budget "$budget" \
    --report "$out/raw/$name.json" --stream "$out/raw/$name.jsonl" --overwrite "$@"
}

field_fuzz() {  # field_fuzz NAME BACKENDS [ARGS...]: a FUZZ_BUDGET campaign, cut off at FUZZ_LIMIT seconds
  local name=$1 backends=$2; shift 2
  timeout -k 20 "${FUZZ_LIMIT:-480}" $dt fuzz --device cuda --budget "${FUZZ_BUDGET:-5m}" --backends "$backends" \
    --repro-dir "$out/raw/$name-bundles" --stream "$out/$name.jsonl" --report "$out/$name.json" "$@"
}

step_field() {  # reports/h200/field: one device call per letter, ONLY='^a' ... ONLY='^f'
  local field=$PWD/.device-deps/field budget=${RUN_BUDGET:-150}
  local dg034=/tmp/versions/deep_gemm-0.34.0 tilelang=/tmp/tilelang-site  # device_env.sh unpacks the first
  mkdir -p "$out/raw"
  export PYTHONPATH=$field/vllm-0.34.0:$field/sglang-0.5.23:$field/flag_gems-5.0.2:$field/flashinfer-0.7.2.post1:$PYTHONPATH
  if [ -f .device-tilelang/tilelang-0.1.12-site.tar.xz ] && mkdir "$tilelang" 2>/dev/null; then
    python3 -m tarfile -e .device-tilelang/tilelang-0.1.12-site.tar.xz "$tilelang"
  fi
  # a: the Step5 kernel as both callers use it (0.33.0's file is the same bytes: named only)
  step a0-environment bash -c "nvidia-smi -L; cat $field/manifest.json; ls /tmp/versions /tmp/site $tilelang 2>&1"
  step a1-backends $dt backends --device cuda
  step a2-step5 field_run a2-step5 vllm-step5,vllm-step5-paired "$budget"
  step a3-step5-0.33.0 first "$field/vllm-0.33.0" $dt backends --device cuda
  # b: DeepGEMM 2.8.1 on its own schedule and on FlagGems', timed; the schedules compared
  step b1-deepgemm-flaggems field_run b1-deepgemm-flaggems deepgemm,deepgemm-flaggems-schedule "$budget" --time 5
  step b2-schedules timeout -k 10 100 python3 scripts/field_schedules.py
  step b3-schedules-memcheck timeout -k 10 130 compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 scripts/field_schedules.py --small
  # g: FlagGems' metadata call alone at growing batch sizes (the release's files on the path above)
  step g1-flaggems-batch python3 scripts/field_flaggems_batch.py --limit 100
  # c: DeepGEMM from vllm 0.34.0's tree (bf16 logits); SGLang's torch reference
  step c1-deepgemm-0.34.0 first "$dg034" field_run c1-deepgemm-0.34.0 \
    deepgemm,deepgemm-bf16-logits,deepgemm-flaggems-schedule "$budget" --time 5
  step c2-sglang-torch-ref field_run c2-sglang-torch-ref sglang-torch-ref 120
  # d: FlashInfer's torch reference (a per-block loop) and the kernel's SKIP off sm100
  step d1-flashinfer field_run d1-flashinfer flashinfer-ref,flashinfer "$budget"
  # e: campaigns; the references in their own, so the kernels' campaign never waits on a slow reference
  step e1-fuzz field_fuzz e1-fuzz vllm-step5,vllm-step5-paired,deepgemm,deepgemm-flaggems-schedule --shrink-seconds 20 \
    ${FUZZ_TIMEOUT:+--timeout "$FUZZ_TIMEOUT"}
  step e2-fuzz-references field_fuzz e2-fuzz sglang-torch-ref,flashinfer-ref --shrink-seconds 20
  step e3-fuzz-bf16 first "$dg034" field_fuzz e3-fuzz deepgemm-bf16-logits,deepgemm --shrink-seconds 20
  # f: TileLang (its own carry)
  step f1-tilelang-backends first "$tilelang" $dt backends --device cuda
  step f2-tilelang first "$tilelang" field_run f2-tilelang sglang-tilelang "$budget"
  FUZZ_BUDGET=${TILELANG_FUZZ_BUDGET:-90s} FUZZ_LIMIT=${TILELANG_FUZZ_LIMIT:-200} \
    step f3-tilelang-fuzz first "$tilelang" field_fuzz f3-tilelang-fuzz sglang-tilelang
}

step_versions() {  # reports/matrix (the cells came later): each version first on PYTHONPATH; FILTER, RUN_BUDGET
  local manifest=.device-deps/versions/manifest.json filter=${FILTER:-*} budget=${RUN_BUDGET:-60}
  local archive name dir version blocks
  local aiter=aiter-triton-stage1,aiter-triton-fused,aiter-triton-stage1-ragged,aiter-triton-fused-ragged
  local scenario="--device cuda --no-progress --cases random --batch 16 --next-n 3 --count 1 --heads 64 --head-dim 128"
  manifest_list() { python3 -c "import json, sys; m = json.load(open(sys.argv[1])); print(*($1))" "$manifest"; }
  step 00-versions bash -c "cat $manifest; ls -l /tmp/versions"
  for archive in $(manifest_list "a['archive'] for a in m['deep_gemm_archives']"); do
    name=${archive%.tar.xz}
    dir=/tmp/versions/$name
    step "$name-backends" first "$dir" $dt backends --device cuda
    step "$name" first "$dir" $dt run --device cuda --no-progress --backends deepgemm,deepgemm-flattened \
      --case-filter "$filter" --budget "$budget" --report "$out/$name.json"
    step "$name-straddle" first "$dir" $dt run --device cuda --no-progress --backends torch,deepgemm,deepgemm-flattened \
      --spec "$straddle" --report "$out/$name-straddle.json"
  done
  for version in $(manifest_list "r['vllm'] for r in m['vllm_releases'] if r['triton_decode']"); do
    dir=/tmp/versions/vllm-$version
    step "vllm-triton-decode-$version-backends" first "$dir" $dt backends --device cuda
    step "vllm-triton-decode-$version" first "$dir" $dt run --device cuda --no-progress \
      --backends torch,vllm-triton-decode --case-filter "$filter" --budget "$budget" \
      --report "$out/vllm-triton-decode-$version.json"
  done
  # AITER pinned (/tmp/site) and main; both read one length per sequence, so vllm#59420 runs on each.
  for version in pinned main; do
    dir=/tmp/site blocks="--block-sizes 1"  # 0.1.7.x takes block size 1 only; main's paged kernels take 64
    [ "$version" = main ] && dir=/tmp/versions/aiter-main blocks="--block-sizes 64"
    step "aiter-$version-backends" first "$dir" $dt backends --device cuda
    step "aiter-$version" first "$dir" $dt run --device cuda --no-progress --backends "torch,$aiter" \
      --case-filter "$filter" --budget "$budget" --report "$out/aiter-$version.json"
    step "aiter-$version-59420-per-sequence" first "$dir" $dt run $scenario $blocks \
      --backends torch,aiter-triton-stage1,aiter-triton-fused --report "$out/aiter-$version-59420-per-sequence.json"
    step "aiter-$version-59420-per-row" first "$dir" $dt run $scenario $blocks --encoding per-row \
      --backends aiter-triton-stage1,aiter-triton-fused --report "$out/aiter-$version-59420-per-row.json"
  done
}

step_matrix() {  # reports/matrix/cells: report.json and junit.xml per cell under OUTDIR/matrix/<cell id>/
  local file=reports/matrix/difftest.toml cell
  for cell in $($dt matrix plan --file "$file" | awk '$1 ~ /^sm90\/[^/]+\/[^/]+$/ {print $1}' | grep -E "${CELLS:-.}"); do
    step "${cell//\//-}" $dt matrix run "$cell" --file "$file" --out "$out/${cell//\//-}"
  done
}

# ----------------------------------------------------------------------------------- benchmarks and tests

step_bench() {  # reports/h200/fused-oracle, fuzz-breakdown, fuzz-rate (SWEEP=1 adds the fused oracle's sweep)
  environment
  step 01-fused python3 bench/fused_oracle.py ${SWEEP:+--sweep} --out "$out/fused-oracle"
  step 02-breakdown python3 bench/fuzz_breakdown.py --device cuda --backends torch,deepgemm --out "$out/breakdown"
  step 03-fuzz-rate python3 bench/fuzz_rate.py --device cuda --backends torch,deepgemm --seconds "${RATE_SECONDS:-30}" \
    --regimes "${REGIMES:-small,large}" --warmup "${WARMUP:-60}" --out "$out/fuzz-rate"
}

step_gpu_tests() {
  environment
  step pytest-gpu python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests
}

# -------------------------------------------------------------------------------------------------- main

main() {
  if [[ ${1:-} == --list ]]; then list_steps; return 0; fi
  if [ $# -lt 2 ]; then
    echo "usage: bash scripts/device_visit.sh STEP [STEP ...] OUTDIR (bash scripts/device_visit.sh --list: the steps)" >&2
    return 2
  fi
  local outdir=${*: -1} name
  local steps=("${@:1:$#-1}")
  for name in "${steps[@]}"; do
    is_step "$name" || { echo "device_visit.sh: step '$name': expected one of: $(list_steps | awk 'NR > 1 {print $1}' | tr '\n' ' ')" >&2; return 2; }
  done
  source scripts/device_env.sh  # the carried libraries and wheels, $dt, step and timed_step
  for name in "${steps[@]}"; do
    out=$outdir/$name
    mkdir -p "$out"
    echo "== $name -> $out"
    ( "step_${name//-/_}" )  # a subshell: what a step exports (PYTHONPATH, CUDA_HOME) ends with it
  done
}

main "$@"
