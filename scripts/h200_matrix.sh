#!/usr/bin/env bash
# The H200 cells of reports/matrix/difftest.toml, each run by `difftest matrix run` (report.json and
# junit.xml per cell under OUTDIR/<cell id>/), then packed into one archive: the device returns at most
# 8 files. CELLS=regex picks cells (one device call is 10 minutes; each DeepGEMM version JIT-compiles
# its kernels afresh). Device, from the repo root, carry [".device-deps", ".whl"]:
#   CELLS='deepgemm' bash scripts/h200_matrix.sh /tmp/matrix && tar czf $OUT/matrix.tgz -C /tmp matrix
set -uo pipefail
out=${1:?usage: h200_matrix.sh OUTDIR}
mkdir -p "$out"
source scripts/device_env.sh
file=reports/matrix/difftest.toml
cells=$($dt matrix plan --file "$file" | awk '$1 ~ /^sm90\/[^/]+\/[^/]+$/ {print $1}' | grep -E "${CELLS:-.}")
for cell in $cells; do
  id=${cell//\//-}
  step "$id" $dt matrix run "$cell" --file "$file" --out "$out/$id"
done
