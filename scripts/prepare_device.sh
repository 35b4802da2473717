#!/usr/bin/env bash
# Everything a device visit carries, from the project root: the pinned kernel libraries (written
# to .device-deps/ by the team's dependency script, PREPARE_DEPS=path/to/prepare-deps.sh) and the
# amd-aiter dist-info (so importlib.metadata names the version on the device: that script keeps only
# the Python tree). Then: device run with carry [".device-deps"] and `bash scripts/h200_session.sh $OUT`.
set -euo pipefail
bash "${PREPARE_DEPS:?the dependency script that writes .device-deps/}"
cache=${DIFFTEST_WHEEL_CACHE:-$HOME/.cache/difftest-wheels}
python3 - "$cache" <<'PY'
import glob, sys, zipfile
wheel = sorted(glob.glob(f"{sys.argv[1]}/amd_aiter-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    # dist-info for importlib.metadata, and the _version.py prepare-deps.sh drops
    z.extractall(".device-deps/aiter-dist",
                 [n for n in z.namelist() if ".dist-info/" in n or n == "aiter/_version.py"])
PY
