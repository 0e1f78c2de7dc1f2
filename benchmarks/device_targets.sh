# One H200 call for the issue-2 targets that are still missed, each against what the machine
# allows: (1) the plain-read floors (benchmarks/stream_floor.py, same harness as the bench);
# (2) the tracing cost at sk 131072 for each AOT build in $BUILDS (benchmarks/trace_cost.py:
# the untraced kernel against recorder buffers that choose who stores records); (3) optionally
# one recorded trace per build and shape, summarized. Tables in $OUT/floor.md and $OUT/cost.md,
# summaries in $OUT/summary.txt, logs in $OUT/log.txt. Carry .devkit and build/<each build>.
#   BUILDS="kernels kernels:stalls xe:stalls" bash benchmarks/device_targets.sh
# Knobs (environment):
#   FLOOR_SHAPES  d:hq:hkv:sk:b,... for the floors ('' skips them)
#   BUILDS        build folder names under build/, each optionally :EVENTS (core | stalls | an
#                 experiment build's comma event list | none; default core)
#   COST_SHAPES ('' skips the cost tables), SCHEDULES (pingpong,base), VARIANTS (all,first,lead; trace_cost --variants),
#   ROUNDS (3), PADS / OFFSETS / SLABS / REPEAT (trace_cost's buffer-placement experiments)
#   RECORD_BUILDS, RECORD_SHAPES ("d:sk:b ...", default "128:131072:1 64:131072:8"): record a
#                 ping-pong trace per build x shape through the CLI (which fails unless the traced
#                 output equals the untraced one bit for bit) and append its summary
source .devkit/device-env.sh || exit 1
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv > $OUT/log.txt
FLOOR_SHAPES=${FLOOR_SHAPES-128:16:1:131072:8,64:16:1:131072:8,64:16:2:131072:8,64:16:1:131072:32,128:16:2:131072:8,128:16:1:131072:1}
if [ -n "$FLOOR_SHAPES" ]; then
  FA4TRACE_BUILD=build/kernels timeout 300 python3 benchmarks/stream_floor.py --shapes $FLOOR_SHAPES \
      --rounds ${ROUNDS:-3} --json $OUT/floor.json > $OUT/floor.md 2>>$OUT/log.txt
fi
COST_SHAPES=${COST_SHAPES-128:16:1:131072:1,128:16:1:131072:8,128:16:1:131072:32,128:16:2:131072:1,128:16:2:131072:8,128:16:2:131072:32,64:16:1:131072:1,64:16:1:131072:8,64:16:1:131072:32,64:16:2:131072:1,64:16:2:131072:8,64:16:2:131072:32}
if [ -n "$COST_SHAPES" ]; then
  for be in ${BUILDS:-kernels}; do
    b=${be%%:*}; ev=core; [ "$b" != "$be" ] && ev=${be#*:}
    echo "== build/$b, $ev events" >> $OUT/cost.md
    FA4TRACE_BUILD=build/$b timeout 240 python3 benchmarks/trace_cost.py --schedule ${SCHEDULES:-pingpong,base} \
        --shapes $COST_SHAPES --rounds ${ROUNDS:-3} --variants ${VARIANTS:-all,first,lead} --events $ev \
        ${PADS:+--extra-pads $PADS} ${OFFSETS:+--offsets $OFFSETS} ${SLABS:+--slabs $SLABS} \
        ${REPEAT:+--repeat-all $REPEAT} \
        --json "$OUT/cost_${b}_$(echo "$ev" | tr -c 'A-Za-z0-9_\n' '-').json" >> $OUT/cost.md 2>>$OUT/log.txt
  done
fi
for b in ${RECORD_BUILDS:-}; do
  for spec in ${RECORD_SHAPES:-128:131072:1 64:131072:8}; do
    IFS=: read d sk bb <<< "$spec"
    FA4TRACE_BUILD=build/$b timeout 120 python3 -m fa4trace record --schedule pingpong --d $d --sk $sk --b $bb \
        -o /tmp/rec_${b}_${d}_${bb}.parquet --force >> $OUT/log.txt 2>&1 && \
      timeout 60 python3 -m fa4trace summary /tmp/rec_${b}_${d}_${bb}.parquet >> $OUT/summary.txt 2>&1
  done
done
cat $OUT/floor.md $OUT/cost.md $OUT/summary.txt 2>/dev/null
