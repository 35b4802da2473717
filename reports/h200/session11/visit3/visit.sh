#!/usr/bin/env bash
# Session 11 visit 3: production shapes (no regime): a 2-minute campaign with --jobs 4 that bundles and
# shrinks what it finds, then 90 s with one job for its rate.
set -uo pipefail
out=$OUT/s11v3; mkdir -p $out
echo "this tree: $REV" > $out/rev.txt
source scripts/device_env.sh
step production-jobs4 timeout 270 python3 -m difftest.cli fuzz --device cuda --backends torch,deepgemm --budget 2m --jobs 4 --shrink-seconds 20 --repro-dir $out/found --quiet
step production-jobs1 timeout 140 python3 -m difftest.cli fuzz --device cuda --backends torch,deepgemm --budget 90s --shrink-seconds 0 --quiet
cd $OUT && tar czf s11v3.tgz s11v3 && rm -rf s11v3
