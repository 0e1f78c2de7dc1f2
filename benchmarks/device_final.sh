#!/usr/bin/env bash
# Final end-to-end device check: every GPU test, the CLI's record path for our kernels and for
# FA4 from the AOT builds, and the benchmark with FA4's SM90 kernel among the peers.
# Carry: .devkit build/kernels build/fa4_sm90 (built by `fa4trace build -o build/kernels` and
# `python -m fa4trace.fa4.buildtool -o build/fa4_sm90`).
set -u
source .devkit/device-env.sh || exit 1
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 FA4TRACE_BUILD=build/kernels FA4TRACE_FA4_BUILD=build/fa4_sm90
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 300 python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
{
python3 -m fa4trace record --schedule pingpong --d 128 --hq 16 --hkv 1 --sk 32768 --b 1 -o "$OUT/cli_pingpong.parquet" --force
python3 -m fa4trace record --schedule base --d 64 --hq 16 --hkv 2 --sk 4097 --b 2 --sq 3 --dtype fp16 -o "$OUT/cli_base.parquet" --force
python3 -m fa4trace record --schedule pingpong --d 128 --hq 16 --hkv 2 --sk 131072 --b 8 --events stalls --warps lead -o "$OUT/cli_stalls.parquet" --force
python3 -m fa4trace summary "$OUT/cli_stalls.parquet"
python3 -m fa4trace record --impl fa4 --d 128 --hq 16 --hkv 1 --sk 32768 --b 1 -o "$OUT/cli_fa4.parquet" --force
python3 -m fa4trace record --kernel calibration -o "$OUT/cli_cal.parquet" --force
python3 -m fa4trace summary "$OUT/cli_pingpong.parquet"
python3 -m fa4trace compare "$OUT/cli_fa4.parquet" "$OUT/cli_pingpong.parquet"
} 2>&1 | tee "$OUT/cli.log"
timeout 240 python3 -m fa4trace bench --quick --only d=128,hkv=1 --kernels pingpong,cudnn,fa4 --no-trace-overhead \
    --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -12
echo "=== summary"; grep -E "passed|failed" "$OUT/pytest_gpu.log" | tail -2; grep -E "wrote|error" "$OUT/cli.log"
