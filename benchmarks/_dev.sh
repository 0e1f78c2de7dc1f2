source .devkit/device-env.sh >/dev/null 2>&1
pip install -q --no-index --no-deps --target /tmp/site build/wheels/*.whl >/dev/null 2>&1
[ -e fa4trace/kernels ] || ln -s ../kernels fa4trace/kernels
export PYTHONPATH=$PWD:$PYTHONPATH FA4TRACE_COMMIT=${COMMIT:-unknown}
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
mkdir -p $OUT/b
timeout 180 python3 benchmarks/_obs.py check build/ab $OUT/b > $OUT/check.log 2>&1; echo "check rc=$?"; tail -5 $OUT/check.log
timeout 300 python3 benchmarks/_obs.py run build/ab --out $OUT/ab --json $OUT/ab.json --rounds ${ROUNDS:-7} > $OUT/ab.log 2>&1; echo "ab rc=$?"
rm -rf $OUT/ab; cd $OUT && tar czf b.tgz b && rm -rf b
grep '^{' ab.log | python3 -c "
import sys,json
for l in sys.stdin:
    r=json.loads(l); print(r.get('shape'),'|',r.get('build'),'|',r.get('cursor'),'|',r.get('families')[-40:],'|',r.get('plain_us'),r.get('traced_us'),r.get('cost_pct'),r.get('bitwise_equal',''))
"; tail -3 ab.log
