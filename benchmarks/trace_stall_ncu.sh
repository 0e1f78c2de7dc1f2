# One H200 call: where the traced kernel's warps stall, per SASS instruction (ncu source counters,
# PC sampling), for the trace_cost buffers in $VARIANTS (default: all first) at $SHAPE (default
# d64 16:1 sk 131072 b 8 ping-pong). Carry .devkit and the build in $FA4TRACE_BUILD.
# Output: $OUT/<variant>_sass.csv (per-instruction samples), $OUT/<variant>_stalls.txt (summary).
source .devkit/device-env.sh || exit 1
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 FA4TRACE_BUILD=${FA4TRACE_BUILD:-build/kernels}
for v in ${VARIANTS:-all first}; do
  timeout 200 ncu --clock-control none --section WarpStateStats --section SourceCounters \
      --import-source no -k regex:kernel_cutlass -c 1 -f -o $OUT/$v python3 benchmarks/trace_cost.py \
      --shapes ${SHAPE:-64:16:1:131072:8} --schedule ${SCHEDULE:-pingpong} --once $v > $OUT/${v}_ncu_log.txt 2>&1
  ncu --import $OUT/$v.ncu-rep --page source --csv --print-source sass > $OUT/${v}_sass.csv 2>&1
  ncu --import $OUT/$v.ncu-rep --page details --section WarpStateStats > $OUT/${v}_stalls.txt 2>&1
  rm -f $OUT/$v.ncu-rep
done
