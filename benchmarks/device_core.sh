#!/usr/bin/env bash
# One device call for the core issue: recorder GPU tests, the calibration bundle, recorder
# overhead vs IKET on the marker microbenchmark. Needs .devkit and build/kernels carried.
set -u
source .devkit/device-env.sh || exit 1
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 FA4TRACE_BUILD=build/kernels
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest tests/gpu/test_recorder_gpu.py -v -s -p no:cacheprovider 2>&1 | tee "$OUT/pytest_recorder.log" | tail -40
python3 -m fa4trace record --kernel calibration --timebase clock64 -o "$OUT/calibration_h200.parquet" --force 2>&1 | tee "$OUT/calibration.txt"
python3 -m fa4trace record --kernel markers --variant fa4trace --ctas 0:66:16 -o "$OUT/markers_h200.parquet" --force 2>&1 | tee -a "$OUT/calibration.txt"
python3 benchmarks/bench_recorder.py --json "$OUT/recorder_bench.json" 2>&1 | tee "$OUT/recorder_bench.txt"
for cfg in l2:1 l2:2 smem:3 smem:10; do
  rm -rf /tmp/iket
  timeout 150 python3 -m iket.cli.main --output-dir /tmp/iket profile --postprocess none -- \
      python3 benchmarks/iket_workload.py --work "${cfg%%:*}" --chain "${cfg##*:}" --iters 1600 2>&1 \
      | grep -E "IKET_WORKLOAD|rror" | tail -1 | tee -a "$OUT/iket.txt"
done
echo "=== summary"; tail -24 "$OUT/recorder_bench.txt"; cat "$OUT/iket.txt"; grep -E "passed|failed" "$OUT/pytest_recorder.log" | tail -3
