#!/usr/bin/env bash
# Two engines' small-regime fuzz rates on one machine, in alternation: the other engine, this one, the
# other, this one. The first pair warms the machine: DeepGEMM's JIT cache on disk starts empty on a fresh
# machine, and whichever bench runs first pays its compilations, in its baseline as much as in its
# campaign (reports/h200/session9: 112 against 308 cases/s, the first bench of a visit against the
# second). The second pair is the comparison. On the device, from the repo root (carry .device-deps and
# .whl), with the other engine's tree at OTHER, for example
#   git archive REV difftest bench oracles generators scripts difftest_pytest pyproject.toml | tar x -C exp/base
#   REV=$(git rev-parse --short HEAD) bash scripts/h200_ab.sh OUTDIR exp/base
# (RATE_SECONDS, default 20, and WARMUP, default 30, per bench). REV names this tree in env.txt: the device's
# copy of the repository is the working tree, and its git HEAD can be an older commit.
set -uo pipefail
out=$(mkdir -p "${1:?usage: h200_ab.sh OUTDIR OTHER_TREE}" && cd "$1" && pwd)
other=$(cd "${2:?usage: h200_ab.sh OUTDIR OTHER_TREE}" && pwd)
here=$PWD
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/env.txt"
echo "this tree: ${REV:-not named (set REV)}" >> "$out/env.txt"

bench() {  # bench NAME TREE: bench/fuzz_rate.py of the tree, with that tree's own device_env.sh
  (cd "$2" && source scripts/device_env.sh && python3 bench/fuzz_rate.py --device cuda --backends torch,deepgemm \
    --seconds "${RATE_SECONDS:-20}" --regimes small --warmup "${WARMUP:-30}" --out "$out/$1") > "$out/$1-log.txt" 2>&1
}

for round in 1 2; do
  bench "$round-other" "$other"
  bench "$round-this" "$here"
done
python3 bench/fuzz_rate.py --summarize "$out/1-other" "$out/1-this" "$out/2-other" "$out/2-this" | tee "$out/ab.md"
