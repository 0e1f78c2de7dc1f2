# One H200 call: benchmarks/trace_cost.py on each AOT build named in $BUILDS (default: kernels),
# same process order, same machine; table per build in $OUT/cost.md.
source .devkit/device-env.sh || exit 1
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/log.txt
for b in ${BUILDS:-kernels}; do
  echo "== build/$b" >> $OUT/cost.md
  FA4TRACE_BUILD=build/$b timeout 200 python3 benchmarks/trace_cost.py --schedule ${SCHEDULES:-pingpong,base} \
      ${SHAPES:+--shapes $SHAPES} ${PADS:+--extra-pads $PADS} ${OFFSETS:+--offsets $OFFSETS} ${SLABS:+--slabs $SLABS} ${REPEAT:+--repeat-all $REPEAT} ${ROUNDS:+--rounds $ROUNDS} ${VARIANTS:+--variants $VARIANTS} --json $OUT/cost_$b.json >> $OUT/cost.md 2>>$OUT/log.txt
done
# Optional: record one trace per (build in $RECORD_BUILDS) x shape through the CLI (the traced output
# must equal the untraced one bit for bit, else the record fails) and summarize it.
for b in ${RECORD_BUILDS:-}; do
  for spec in ${RECORD_SHAPES:-128:131072:1 64:131072:8}; do
    IFS=: read d sk bb <<< "$spec"
    FA4TRACE_BUILD=build/$b timeout 120 python3 -m fa4trace record --schedule pingpong --d $d --sk $sk --b $bb \
        -o /tmp/rec_${b}_${d}_${bb}.parquet --force >> $OUT/log.txt 2>&1 && \
      timeout 60 python3 -m fa4trace summary /tmp/rec_${b}_${d}_${bb}.parquet >> $OUT/summary.txt 2>&1
  done
done
