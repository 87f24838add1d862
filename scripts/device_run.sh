#!/usr/bin/env bash
# On a machine with an accelerator and no package registry, from the repository root: installs into
# SITE (default /tmp/site) the wheels in DIR (gathered by scripts/device_wheels.sh) of the
# distributions this Python lacks, then runs the device suite on the image's own jax. Arguments after
# DIR reach the suite (default: --budget-s 420). Where every wheel may be installed, it is:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site DIR/*.whl &&
#     PYTHONPATH=/tmp/site:src python3 benchmarks/device_suite.py --budget-s 420
#
#   scripts/device_run.sh DIR [device_suite.py arguments ...]
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [device_suite.py arguments ...]" >&2
  exit 2
fi
dir=$1
shift
if [ $# -eq 0 ]; then
  set -- --budget-s 420
fi
site=${SITE:-/tmp/site}
python=${PYTHON:-python3}

# A distribution the image has keeps its own version (the image's torch, say, keeps its sympy).
missing=()
for wheel in "$dir"/*.whl; do
  name=$(basename "$wheel" | cut -d- -f1)
  if ! "$python" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$name" 2>/dev/null; then
    missing+=("$wheel")
  fi
done
echo "installing ${#missing[@]} wheels into $site" >&2
if [ ${#missing[@]} -gt 0 ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "${missing[@]}"
fi
PYTHONPATH="$site:src${PYTHONPATH:+:$PYTHONPATH}" exec "$python" benchmarks/device_suite.py "$@"
