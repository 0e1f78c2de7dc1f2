#!/usr/bin/env bash
# Every GPU check and benchmark of fa4trace in one run, on a GPU machine (H100/H200) that holds
# AOT builds made on any machine with the CuTe DSL:
#
#   fa4trace build -o build/kernels                      # decode attention, calibration, markers
#   python -m fa4trace.fa4.buildtool -o build/fa4_sm90   # FlashAttention-4's SM90 forward
#   OUT=artifacts/device bash benchmarks/device_run.sh   # from the repository root, on the GPU machine
#
# Steps (each with its log under $OUT; a failing step is reported and the run goes on):
#   tests     python -m pytest -q tests/gpu                     -> $OUT/tests.log
#   bench     fa4trace bench (the full matrix)                  -> $OUT/bench/bench.json, bench.md
#   recorder  benchmarks/bench_recorder.py                      -> $OUT/markers.json
#   floors    benchmarks/stream_floor.py (needs CuPy)           -> $OUT/floors.json
#   cost      benchmarks/trace_cost.py                          -> $OUT/trace_cost.json
#   fa4       benchmarks/fa4_sm90_device.py (+ log, bundles)    -> $OUT/fa4_sm90.json, $OUT/fa4_sm90/
#   sweep-overhead  benchmarks/bench_sweep_overhead.py          -> $OUT/sweep_overhead.json
#   sweep-pool      benchmarks/bench_sweep_pool.py (2 workers)  -> $OUT/sweep_pool.json
#   auto      benchmarks/auto_kernels.py run (instrumented quack GEMM, FA4 prefill, decode) -> $OUT/auto_kernels.json, $OUT/auto/
# then a summary table (also in $OUT/summary.md). The JSON files are result files in the schema
# of benchmarks/report.py: copy one to benchmarks/results/ and run `python benchmarks/report.py`.
#
# Environment (all optional):
#   OUT             output folder (default artifacts/device)
#   STEPS           which steps, in order (default "tests bench recorder floors cost fa4 sweep-overhead sweep-pool auto")
#   PYTHON          the interpreter (default python3)
#   DEVICE_ENV      a file to source first that sets up Python and CUDA (default .devkit/device-env.sh,
#                   sourced when it exists)
#   FA4TRACE_BUILD, FA4TRACE_FA4_BUILD   the AOT builds (default build/kernels, build/fa4_sm90)
#   FA4TRACE_AUTO_BUILD   benchmarks/auto_kernels.py's build (default build/auto; tests/gpu/test_auto_gpu.py)
#   BENCH_ARGS      extra arguments for `fa4trace bench` (e.g. "--quick --kernels pingpong,cudnn")
#   STEP_TIMEOUT    seconds per step, where `timeout` exists (default: no limit)
set -u
cd "$(dirname "$0")/.." || exit 1
DEVICE_ENV=${DEVICE_ENV:-.devkit/device-env.sh}
if [ -f "$DEVICE_ENV" ]; then
  # shellcheck disable=SC1090
  source "$DEVICE_ENV" || { echo "sourcing $DEVICE_ENV failed" >&2; exit 1; }
fi
PYTHON=${PYTHON:-python3}
OUT=${OUT:-artifacts/device}
STEPS=${STEPS:-tests bench recorder floors cost fa4 sweep-overhead sweep-pool auto}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Run from a source checkout without `pip install`: the package maps kernels/ to fa4trace.kernels
# (pyproject's package-dir); a link gives a plain PYTHONPATH the same view.
if ! "$PYTHON" -c "import fa4trace.kernels.decode_spec" 2>/dev/null && [ ! -e fa4trace/kernels ]; then
  ln -s ../kernels fa4trace/kernels && echo "linked fa4trace/kernels -> ../kernels (source checkout, not installed)"
fi
export FA4TRACE_BUILD=${FA4TRACE_BUILD:-build/kernels} FA4TRACE_FA4_BUILD=${FA4TRACE_FA4_BUILD:-build/fa4_sm90}
mkdir -p "$OUT" || exit 1

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git rev-parse --short HEAD 2>/dev/null || echo "commit: not a git checkout"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv 2>&1 || echo "nvidia-smi: not available"
  echo "FA4TRACE_BUILD=$FA4TRACE_BUILD FA4TRACE_FA4_BUILD=$FA4TRACE_FA4_BUILD"
} | tee "$OUT/machine.txt"
for b in "$FA4TRACE_BUILD" "$FA4TRACE_FA4_BUILD"; do
  [ -f "$b/manifest.json" ] || echo "warning: no AOT build at $b (steps that need it fail unless the CuTe DSL can compile here)"
done

SUMMARY=()
run_step() {  # run_step NAME OUTPUT CMD...: runs CMD with its output in $OUT/NAME.log
  local name=$1 output=$2 rc t0 t1
  shift 2
  echo "=== $name: $*"
  t0=$(date +%s)
  if [ -n "${STEP_TIMEOUT:-}" ] && command -v timeout >/dev/null; then
    timeout "$STEP_TIMEOUT" "$@" > "$OUT/$name.log" 2>&1
  else
    "$@" > "$OUT/$name.log" 2>&1
  fi
  rc=$?
  t1=$(date +%s)
  tail -n 5 "$OUT/$name.log"
  if [ "$rc" -eq 0 ]; then
    SUMMARY+=("| $name | ok | $((t1 - t0)) | $output |")
  else
    echo "$name FAILED (exit $rc): see $OUT/$name.log"
    SUMMARY+=("| $name | **failed (exit $rc)** | $((t1 - t0)) | $OUT/$name.log |")
  fi
}

for step in $STEPS; do
  case $step in
    tests)    run_step tests "$OUT/tests.log" "$PYTHON" -m pytest -q -p no:cacheprovider tests/gpu ;;
    # shellcheck disable=SC2086
    bench)    run_step bench "$OUT/bench/bench.json" "$PYTHON" -m fa4trace bench --out "$OUT/bench" ${BENCH_ARGS:-} ;;
    recorder) run_step recorder "$OUT/markers.json" "$PYTHON" benchmarks/bench_recorder.py --json "$OUT/markers.json" ;;
    floors)   run_step floors "$OUT/floors.json" "$PYTHON" benchmarks/stream_floor.py --json "$OUT/floors.json" ;;
    cost)     run_step cost "$OUT/trace_cost.json" "$PYTHON" benchmarks/trace_cost.py --json "$OUT/trace_cost.json" ;;
    fa4)      run_step fa4 "$OUT/fa4_sm90.json" "$PYTHON" benchmarks/fa4_sm90_device.py --out "$OUT/fa4_sm90" \
                  --json "$OUT/fa4_sm90.json" ;;
    sweep-overhead) run_step sweep-overhead "$OUT/sweep_overhead.json" "$PYTHON" benchmarks/bench_sweep_overhead.py \
                  --json "$OUT/sweep_overhead.json" ;;
    sweep-pool) run_step sweep-pool "$OUT/sweep_pool.json" "$PYTHON" benchmarks/bench_sweep_pool.py --gpus 0,0 \
                  --json "$OUT/sweep_pool.json" ;;
    auto)     run_step auto "$OUT/auto_kernels.json" "$PYTHON" benchmarks/auto_kernels.py run \
                  "${FA4TRACE_AUTO_BUILD:-build/auto}" --out "$OUT/auto" --json "$OUT/auto_kernels.json" ;;
    *)        echo "unknown step $step (known: tests bench recorder floors cost fa4 sweep-overhead sweep-pool auto)"
              SUMMARY+=("| $step | **unknown step** | 0 | - |") ;;
  esac
done

{
  echo
  echo "| step | result | seconds | output |"
  echo "|---|---|---|---|"
  printf '%s\n' "${SUMMARY[@]}"
  grep -hE "^[0-9]+ (passed|failed)|passed|failed" "$OUT/tests.log" 2>/dev/null | tail -n 1 | sed 's/^/tests: /'
} | tee "$OUT/summary.md"
for s in "${SUMMARY[@]}"; do
  case $s in *failed*|*unknown*) exit 1 ;; esac
done
exit 0
