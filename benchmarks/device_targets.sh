# One H200 call for the issue-2 targets that are still missed, each against what the machine
# allows: (1) the plain-read floor of the b >= 8 shapes below 4.4 TB/s (benchmarks/stream_floor.py,
# same harness as the bench); (2) the tracing cost at sk 131072 for each AOT build in $BUILDS
# (benchmarks/trace_cost.py: every warp, only CTA 0, lead warps). Tables in $OUT/floor.md and
# $OUT/cost.md, logs in $OUT/log.txt.
#   BUILDS="kernels kernels:stalls xe:stalls" bash benchmarks/device_targets.sh
#   (carry .devkit and build/<each>; FLOOR_SHAPES= skips the floors)
source .devkit/device-env.sh || exit 1
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/log.txt
FLOOR_SHAPES=${FLOOR_SHAPES-128:16:1:131072:8,64:16:1:131072:8,64:16:2:131072:8,64:16:1:131072:32,128:16:2:131072:8,128:16:1:131072:1}
if [ -n "$FLOOR_SHAPES" ]; then
  FA4TRACE_BUILD=build/kernels timeout 300 python3 benchmarks/stream_floor.py --shapes $FLOOR_SHAPES \
      --rounds 3 --json $OUT/floor.json > $OUT/floor.md 2>>$OUT/log.txt
fi
COST_SHAPES=${COST_SHAPES:-128:16:1:131072:1,128:16:1:131072:8,128:16:1:131072:32,128:16:2:131072:1,128:16:2:131072:8,128:16:2:131072:32,64:16:1:131072:1,64:16:1:131072:8,64:16:1:131072:32,64:16:2:131072:1,64:16:2:131072:8,64:16:2:131072:32}
# each entry of $BUILDS: a build folder name, optionally :EVENTS (core | stalls | an experiment
# build's comma event list | none; default core)
for be in ${BUILDS:-kernels}; do
  b=${be%%:*}; ev=core; [ "$b" != "$be" ] && ev=${be#*:}
  echo "== build/$b, $ev events" >> $OUT/cost.md
  FA4TRACE_BUILD=build/$b timeout 240 python3 benchmarks/trace_cost.py --schedule pingpong,base \
      --shapes $COST_SHAPES --rounds 3 --variants ${VARIANTS:-all,first,lead} --events $ev \
      --json "$OUT/cost_${b}_$(echo "$ev" | tr -c 'A-Za-z0-9_\n' '-').json" >> $OUT/cost.md 2>>$OUT/log.txt
done
cat $OUT/floor.md $OUT/cost.md 2>/dev/null
