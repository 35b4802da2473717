#!/usr/bin/env bash
# Everything a device visit carries, from the project root: the pinned kernel libraries (written
# to .device-deps/ by the team's dependency script, PREPARE_DEPS=path/to/prepare-deps.sh) and the
# amd-aiter dist-info (so importlib.metadata names the version on the device: that script keeps only
# the Python tree); and .whl/, the wheels of the Python packages the device image lacks, for its Python
# 3.12 (scripts/device_env.sh installs them there): pydantic and junitparser, which difftest needs, and
# pyinstrument, which profiles a campaign's main thread (scripts/h200_engine.sh). Then: device run with
# carry [".device-deps", ".whl"] and `bash scripts/h200_session.sh $OUT`.
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
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --dest .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 \
  typing_extensions==4.16.0 typing_inspection==0.4.5 junitparser==5.0.3 pyinstrument==5.1.3
