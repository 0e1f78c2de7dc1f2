# One H200 call: hardware counters (ncu, one cold launch each) of the traced d128 16:1 sk 131072 b 8
# ping-pong with the recorder buffers of benchmarks/trace_cost.py (all / consumers / first) and
# the untraced kernel. Carry .devkit and build/kernels. Output: $OUT/ncu.txt.
source .devkit/device-env.sh || exit 1
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 FA4TRACE_BUILD=${FA4TRACE_BUILD:-build/kernels}
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_write_lookup_miss.sum
for v in all consumers first plain; do
  echo "== $v" >> $OUT/ncu.txt
  timeout 100 ncu --clock-control none --metrics $M -k regex:kernel_cutlass python3 benchmarks/trace_cost.py \
      --shapes 128:16:1:131072:8 --once $v 2>&1 | grep -E "^\s+(gpu__|dram__|lts__)" >> $OUT/ncu.txt
done
