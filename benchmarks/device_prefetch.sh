#!/usr/bin/env bash
# Eleventh session, one H200 call (carry .devkit build/kernels build/np build/fa4_sm90): the
# launch-time KV prefetch (DecodeAttentionSm90.prefetch_kv) is in build/kernels; build/np is
# the same source built with kv_prefetch=0 (`attn_build.py --option kv_prefetch=0 --only bf16`).
#   1. every GPU test on the new build;
#   2. A/B of the three schedules, build/np vs build/kernels, interleaved rounds;
#   3. the full benchmark matrix (ours three schedules, cuDNN, FLASH) unless FULL=0;
#   4. the traces shipped in traces/, re-recorded on the new build.
# At most 8 files come back from a device call: $OUT gets tests.txt, ab.txt, ab.json,
# bench.json, bench.md, traces.tar, traces.log.
set -u
source .devkit/device-env.sh || exit 1
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 FA4TRACE_BUILD=build/kernels FA4TRACE_FA4_BUILD=build/fa4_sm90
OUT=${OUT:-/tmp/out}
python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/tests.txt"
S=${SHAPES:-128:16:1:131072:1,128:16:2:131072:1,64:16:1:131072:1,64:16:2:131072:1,128:16:1:32768:1,64:16:1:32768:1,128:16:1:4096:1,128:16:1:131072:8,64:16:1:131072:8}
mkdir -p /tmp/ab
for sch in pingpong base intrawg; do
  echo "== $sch" | tee -a "$OUT/ab.txt"
  python3 benchmarks/attn_builds_compare.py --builds build/np,build/kernels --shapes $S --check-shapes "" \
      --schedule $sch --rounds 5 --json "/tmp/ab/$sch.json" 2>&1 | tail -11 | tee -a "$OUT/ab.txt"
done
python3 -c "import json,sys; json.dump({s: json.load(open(f'/tmp/ab/{s}.json')) for s in ('pingpong','base','intrawg')}, open(sys.argv[1],'w'), indent=1)" "$OUT/ab.json"
if [ "${FULL:-1}" = 1 ]; then
  python3 -m fa4trace bench --kernels base,pingpong,intrawg,cudnn,flash --out /tmp/full 2>&1 | tail -2
  cp /tmp/full/bench.json /tmp/full/bench.md "$OUT/"
fi
python3 benchmarks/attn_device_run.py --phases traces --out /tmp/tr --trace-events stalls 2>&1 | tail -3
cp /tmp/tr/traces.tar "$OUT/" && cp /tmp/tr/run.log "$OUT/traces.log"
ls -la "$OUT"
