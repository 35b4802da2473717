#!/usr/bin/env bash
# Session 11 visit 1, call 1: GPU tests; after a warm-up, warm 25-s campaigns alternating e7f0fbe (exp/base)
# and this tree (the top-k ranking); then 40-s campaigns of this tree with --jobs 1, 2, 3, 4.
set -uo pipefail
out=$OUT/s11v1; mkdir -p $out
echo "this tree: $REV; exp/base: git archive e7f0fbe" > $out/rev.txt
here=$PWD
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $out/env.txt
echo "cpus: $(nproc)" >> $out/env.txt
args="--device cuda --backends torch,deepgemm --max-batch 16 --max-context 8192 --heads 64 --head-dim 128 --block-size 64 --shrink-seconds 0 --seed 0"
step gpu-tests timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/difftest/test_comparison.py tests/difftest/test_fuzz_jobs.py -rA
timeout 120 python3 -m difftest.cli fuzz $args --budget 80s > $out/warmup.txt 2>&1
echo "warmup: $(grep -E 'cases in' $out/warmup.txt)"
for round in 1 2; do
  for tree in exp/base .; do
    name=$round-$(basename $(cd $tree && pwd))
    (cd $tree && source $here/scripts/device_env.sh && timeout 60 python3 -m difftest.cli fuzz $args --budget 25s) > $out/$name.txt 2>&1
    echo "$name: $(grep -E 'cases in' $out/$name.txt) | $(grep -E 'tried again' $out/$name.txt)"
  done
done | tee $out/summary.txt
for jobs in 1 2 3 4; do
  timeout 80 python3 -m difftest.cli fuzz $args --budget 40s --jobs $jobs > $out/jobs-$jobs.txt 2>&1
  echo "jobs $jobs: $(grep -E 'cases in' $out/jobs-$jobs.txt) | $(grep -E '^lost' $out/jobs-$jobs.txt)"
done | tee $out/jobs-summary.txt
cd $OUT && tar czf s11v1.tgz s11v1 && rm -rf s11v1
