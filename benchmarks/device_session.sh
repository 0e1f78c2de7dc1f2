#!/usr/bin/env bash
# One H200 call that checks and measures everything the decode-attention issue names, from the
# AOT builds made on the CPU machine (carry .devkit build/kernels build/fa4_sm90):
#   1. benchmarks/device_final.sh: every GPU test, the CLI record paths, FA4 in the bench;
#   2. benchmarks/attn_device_run.py: smoke check of every built variant, the full benchmark
#      matrix (ours base/pingpong, cuDNN, FLASH, FA4 SM90; tracing overhead at sk 131072),
#      the six traces shipped in traces/.
# $OUT gets <= 8 files: final.tar, run.log, result.json, bench.json, bench.md, traces.tar.
set -u
source .devkit/device-env.sh || exit 1
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 FA4TRACE_BUILD=build/kernels FA4TRACE_FA4_BUILD=build/fa4_sm90
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/final"
OUT="$OUT/final" bash benchmarks/device_final.sh
tar -C "$OUT" -cf "$OUT/final.tar" final && rm -rf "$OUT/final"
python3 benchmarks/attn_device_run.py --phases ${PHASES:-smoke,bench,traces} --deadline 420 --out "$OUT" \
    --bench-args "--kernels ${KERNELS:-base,pingpong,cudnn,flash,fa4}"
