# Sourced by scripts/device_visit.sh (or by hand, before a bench or a difftest command), from the repo root on
# the device: unpacks the carried kernel libraries into /tmp/site and puts them and the repo on PYTHONPATH.
# What is not carried is skipped (a step that needs only the wheels carries .whl alone).
# Once per machine: two visits may run side by side, and must not unpack under each other's imports.
# One unpacks while any other waits for it: the flock (not the mkdir, which a second one would pass
# while the first is still unpacking) keeps a visit from importing a half-installed site.
exec 9>/tmp/device_env.lock
flock 9
if mkdir /tmp/site 2>/dev/null; then
  [ -f .device-deps/deep_gemm.tgz ] && tar xzf .device-deps/deep_gemm.tgz -C /tmp/site
  [ -d .device-deps/aiter ] && cp -r .device-deps/aiter .device-deps/aiter-dist/* /tmp/site/
fi
# The version axis (scripts/prepare_versions.sh), once per machine like /tmp/site: each archive of
# .device-deps/versions unpacked into /tmp/versions/<name>/, each directory copied there. A version
# is chosen per command by putting its directory first on PYTHONPATH (docs/versions.md); python's
# tarfile reads the xz archives, whether or not the image has xz.
if [ -d .device-deps/versions ] && mkdir /tmp/versions 2>/dev/null; then
  for entry in .device-deps/versions/*; do
    name=$(basename "$entry")
    if [[ $name == *.tar.xz ]]; then
      python3 -m tarfile -e "$entry" "/tmp/versions/${name%.tar.xz}"
    elif [ -d "$entry" ]; then
      cp -r "$entry" /tmp/versions/
    fi
  done
fi
# Python dependencies the image lacks, as wheels (scripts/prepare_device.sh downloads them to .whl/).
if [ -d .whl ] && mkdir /tmp/site/.wheels 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
# No `pip install -e .` there (no network): PYTEST_PLUGINS loads the plugin that the pytest11 entry
# point would, in every pytest process, pytester's inline runs and xdist workers included.
# The device image sets PYTHONDONTWRITEBYTECODE: every process, the workers' fork server included, then
# compiles torch's Python from source on import (about 9 s of a campaign's start there). An installed
# torch comes with its bytecode; caching it under /tmp gives the visit's processes the same start.
flock -u 9
exec 9>&-
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTEST_PLUGINS=difftest_pytest.plugin
dt="python3 -m difftest.cli"

source scripts/device_steps.sh  # step, timed_step: what a visit records per step
