#!/usr/bin/env bash
# Session 11 visit 2: bench/fuzz_rate.py, small regime, fuzz against --jobs 2 and 4 (after a 90-s warm-up);
# then a 2-minute production-shape campaign with --jobs 4 that bundles and shrinks what it finds.
set -uo pipefail
out=$OUT/s11v2; mkdir -p $out
echo "this tree: $REV" > $out/rev.txt
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $out/env.txt
echo "cpus: $(nproc)" >> $out/env.txt
step fuzz-rate timeout 330 python3 bench/fuzz_rate.py --device cuda --backends torch,deepgemm --regimes small --seconds 40 --warmup 90 --jobs 2,4 --out $out/fuzz-rate
step production-jobs4 timeout 250 python3 -m difftest.cli fuzz --device cuda --backends torch,deepgemm --budget 2m --jobs 4 --shrink-seconds 20 --repro-dir $out/found --quiet
cd $OUT && tar czf s11v2.tgz s11v2 && rm -rf s11v2
