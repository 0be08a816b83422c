#!/usr/bin/env bash
# The GPU check as one command on a lent GPU machine (nothing can be fetched there): installs the wheels carried in
# .whl/ into /tmp/site, then runs benchmarks/gpu_check.py with its log in $OUT (or the current folder).
#
# Prepare the wheels here first (the machine's image has torch, numpy, safetensors, tokenizers, jinja2, pillow,
# msgpack, matplotlib, and what gguf needs; only gguf itself is missing):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl gguf==0.19.0
# then run it with `.whl` carried: benchmarks/gpu_check.sh [--only NAME ...]
# NVIDIA's published workloads beyond the two the check runs take minutes each; bench_workloads.py's docstring
# gives the commands (python3 benchmarks/bench_workloads.py --warmup --only NAME ... --json $OUT/NAME.json).
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
timeout 470 python3 benchmarks/gpu_check.py --log "${OUT:-.}/gpu_check.log" "$@"
