#!/usr/bin/env bash
# Everything a device visit carries, from the project root: the pinned kernel libraries
# (../shared/device/prepare-deps.sh), the amd-aiter dist-info (so importlib.metadata names the
# version on the device: prepare-deps.sh keeps only the Python tree), and a copy of ../shared.
# Then: device run with carry [".device-deps", ".device-shared"] and `bash scripts/h200_session.sh $OUT`.
set -euo pipefail
bash ../shared/device/prepare-deps.sh
cache=${DIFFTEST_WHEEL_CACHE:-$HOME/.cache/difftest-wheels}
python3 - "$cache" <<'PY'
import glob, sys, zipfile
wheel = sorted(glob.glob(f"{sys.argv[1]}/amd_aiter-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    # dist-info for importlib.metadata, and the _version.py prepare-deps.sh drops
    z.extractall(".device-deps/aiter-dist",
                 [n for n in z.namelist() if ".dist-info/" in n or n == "aiter/_version.py"])
PY
rm -rf .device-shared && cp -r ../shared .device-shared && chmod -R u+w .device-shared
