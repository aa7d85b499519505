#!/bin/bash
# One prepared GPU run of commbench (issue 36): on one GPU with torch, CuPy, NCCL and nvidia-ml-py
# already installed and no network, in at most 9 minutes, leaving one report folder even when cut off.
#
#   bash benchmarks/gpu_run.sh [REPORT_DIR]      # default: $OUT/gpu-report, else ./gpu-report
#   DRY_RUN=1 bash benchmarks/gpu_run.sh /tmp/r  # on a CPU: every step's command printed, not run
#
# Steps, most wanted first (each with its own time budget, cut to what is left of BUDGET, 540 s):
# env, install, the compute block of issue 47 (Llama 3.1 8B's layer shapes) and the predictions from it, the float check of issue 36, cuda sweeps of every allreduce algorithm (in and out
# of place, --graph), shm on the host CPU (deepspeed_peer.py and shm_fused_knobs.py, issue 38), tune
# (and a sweep that follows its table), the harness-overhead benchmark, cupy and torch sweeps,
# selftest, proxy --validate (trains and replays), then every GPU test file
# in its own pytest process with a per-test timeout (pytest-timeout where installed, else
# faulthandler's traceback dump) and a junit file each. A step past its budget is stopped and
# marked TIMEOUT; one with no time left is marked SKIPPED; ONLY="name1 name2" runs only those.
# Report (<= 8 files, as the device tool brings back): log.txt (everything), summary.md (a row per
# step, written as each ends, then the figures of every JSONL), results.tgz (JSONL, per-step logs,
# junit), packed after every step and on exit, so a run cut off keeps all it finished.
set -u
export PYTHONUNBUFFERED=1 COMMBENCH_NO_COLOR=1
REPORT=${1:-${OUT:-.}/gpu-report}
mkdir -p "$REPORT"
WORK=$(mktemp -d)
mkdir -p "$WORK/res" "$WORK/logs" "$WORK/junit"
BUDGET=${BUDGET:-540}
DRY_RUN=${DRY_RUN:-0}
DRY_SLEEP=${DRY_SLEEP:-0}
ONLY=${ONLY:-}
PY=${PYTHON:-python3}
T0=$(date +%s)
SUMMARY="$REPORT/summary.md"
exec > >(tee -a "$REPORT/log.txt") 2>&1

elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(elapsed) )); }

pack() {
    tar -C "$WORK" -czf "$REPORT/results.tgz.part" res logs junit 2>/dev/null && mv "$REPORT/results.tgz.part" "$REPORT/results.tgz"
}

{
    echo "# commbench GPU run, $(date -u '+%Y-%m-%d %H:%M UTC'), budget ${BUDGET} s$([ "$DRY_RUN" = 1 ] && echo ', DRY RUN: nothing ran')"
    echo
    echo "| step | status | seconds | budget | last line |"
    echo "|---|---|---|---|---|"
} > "$SUMMARY"

# run NAME BUDGET_S COMMAND...: the command under `timeout`, its output in logs/NAME.log, a row in summary.md
run() {
    local name=$1 budget=$2
    shift 2
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
    local l; l=$(left)
    if (( l < 5 )); then
        echo "| $name | SKIPPED (budget) | 0 | $budget | - |" >> "$SUMMARY"
        echo "=== [$(elapsed)s] $name: SKIPPED, no time left"
        return 0
    fi
    (( budget > l )) && budget=$l
    echo "=== [$(elapsed)s] $name (budget ${budget}s): $*"
    local start rc log="$WORK/logs/$name.log"
    start=$(date +%s)
    if [ "$DRY_RUN" = 1 ]; then
        echo "dry run: $*" > "$log"
        timeout -k 2 "$budget" sleep "$DRY_SLEEP"
        rc=$?
    else
        timeout -k 5 "$budget" "$@" > "$log" 2>&1
        rc=$?
    fi
    local took=$(( $(date +%s) - start )) status
    case $rc in
        0) status=ok ;;
        124|137) status=TIMEOUT ;;
        *) status="FAIL (exit $rc)" ;;
    esac
    local last; last=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-160 | tr '|' '/')
    tail -n 15 "$log"
    echo "--> $name: $status in ${took}s"
    echo "| $name | $status | $took | $budget | ${last:--} |" >> "$SUMMARY"
    pack
}

figures() {
    [ "$DRY_RUN" = 1 ] && return 0
    "$PY" - "$WORK/res" >> "$SUMMARY" 2>/dev/null <<'PY'
import glob, json, os, sys
print("\n## Figures (time_us per point; wrong; the algorithm and what chose it)\n")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl"))):
    rows = []
    for line in open(path, encoding="utf-8"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("record") == "result":
            rows.append(f"{r['collective']} {r['nbytes']} {r['placement']}: {r.get('time_us')} us, wrong "
                        f"{r.get('wrong')}, {r.get('algorithm')} ({r.get('tuning')})")
    print(f"### {os.path.basename(path)} ({len(rows)} points)\n")
    print("\n".join(f"    {row}" for row in rows[:80]) + "\n")
PY
}

finish() {
    trap - EXIT TERM INT
    local why=${1:-done}
    echo "" >> "$SUMMARY"
    echo "Ended ($why) after $(elapsed) s of ${BUDGET} s." >> "$SUMMARY"
    figures
    pack
    echo "=== [$(elapsed)s] report in $REPORT ($why)"
}
trap 'finish "cut off"; exit 143' TERM INT
trap 'finish done' EXIT

R="$WORK/res"
CUDA8=(sweep --backend cuda -N 8 --cuda-mode virtual --graph --sizes 1K,64K,256K,1M,16M,256M)

run env 15 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version,pci.bus_id --format=csv; \
    $PY -c 'import sys, torch, cupy; from cupy.cuda import nccl; print(sys.version.split()[0], torch.__version__, cupy.__version__, nccl.get_version())'"
run install 60 "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .
# issue 47 first in line: Llama 3.1 8B's operators at the shapes of five layouts' ranks on this GPU (target 60 s),
# then the layouts predicted from that block beside the same at one rate, 400 TFLOPS
run compute_8b 90 "$PY" -m commbench compute llama3.1-8b --gpus 8 --layout dp8 --layout tp2,dp4 --layout tp4,dp2 \
    --layout tp8,dp1 --layout tp4sp,cp2,dp1 --hw dgx-h100 -o "$R/compute-8b.json"
run predict_8b 20 bash -c "for rate in '' '--tflops 400'; do $PY -m commbench \
    predict-scaling llama3.1-8b --gpus 8 --hw $R/compute-8b.json --layout dp8 --layout tp2,dp4 --layout tp4,dp2 \
    --layout tp8,dp1 --layout tp4sp,cp2,dp1 --global-batch 64 \$rate; done"
run float_check 120 "$PY" -m pytest -q -p no:cacheprovider -rA --junitxml "$WORK/junit/float_check.xml" \
    "tests/unit/backends/cuda/test_nccl.py::test_every_collective_passes_the_check[float32]" \
    "tests/unit/backends/cuda/test_nccl.py::test_every_collective_passes_the_check[int32]"
for algorithm in auto oneshot twoshot ring rhd tree binomial; do
    # the first sweep compiles the kernels with NVRTC (CuPy caches them on disk for the rest): 14 s was too
    # little for it on a fresh H100 (2026-11-27)
    run "cuda_$algorithm" "$([ "$algorithm" = auto ] && echo 45 || echo 14)" "$PY" -m commbench "${CUDA8[@]}" \
        --algorithm "$algorithm" --json "$R/cuda8_$algorithm.jsonl"
done
# issue 38 on the GPU machine's host CPU (another machine for shm's targets; local ranks where mpirun is missing)
# (ahead of the GPU steps verified before: the first job plans shm, its probe given up to 40 s)
run shm_host 150 "$PY" benchmarks/deepspeed_peer.py --sizes 1K,1M,16M,256M --pairs 4 --no-deepspeed \
    --out-dir "$WORK/res/shm_host" --json "$R/shm_host.json"
# ... and the fused kernel alone there, knob by knob (the H100's Intel host ran shm at 0.51 of copybound at 256 MiB
# and at 0.66 with 1 KiB blocks: docs/performance.md, "An Intel host")
run shm_knobs_host 40 "$PY" benchmarks/shm_fused_knobs.py --size 256M --rounds 6 --reps 2 copy:thp copy:shm \
    fused:segpad:block=8192,nt=4 fused:segpad:block=1024,nt=4 fused:segpad:block=1024,nt=1 \
    fused:segpad:block=512,nt=4 fusedlocal:segpad:block=1024,nt=4 fused:seg:block=1024,nt=4 \
    fused:seg2k:block=8192,nt=4 fused:seg2k:block=1024,nt=4
run tune 75 "$PY" -m commbench tune --backend cuda -N 8 --cuda-mode virtual --graph --rounds 2 \
    --algorithms oneshot,twoshot,ring --sizes 1K,16K,64K,128K,256K,1M,16M,256M \
    -o "$R/tuning-cuda-virtual.json" --json "$R/tune.jsonl"
run cuda_tuned 15 "$PY" -m commbench "${CUDA8[@]}" --tuning "$R/tuning-cuda-virtual.json" --json "$R/cuda8_tuned.jsonl"
run harness 45 "$PY" benchmarks/gpu_harness_overhead.py --sizes 1K,1M --rounds 4 --iters 100 --json "$R/harness.json"
run cupy 25 "$PY" -m commbench sweep --backend cupy -N 1 --sizes 1K-1G -f 32 --graph --monitor --json "$R/cupy1.jsonl"
run torch 25 "$PY" -m commbench sweep --backend torch -N 1 --sizes 1K-1G -f 32 --json "$R/torch1.jsonl"
run selftest 90 "$PY" -m commbench selftest --timeout 60
run proxy_validate 60 "$PY" -m commbench proxy resnet50 --nprocs 1 --batch 128 --validate --json "$R/proxy_rn50.jsonl"
PER_TEST=(-o faulthandler_timeout=45)
# pytest-timeout by its entry-point name: `-p pytest_timeout` registered the module a second time beside the
# autoloaded `timeout` and every test file failed at start-up (ValueError, H100 run of 2026-11-27)
"$PY" -c "import pytest_timeout" 2>/dev/null && PER_TEST=(-p timeout --timeout 45)
for file in tests/unit/backends/cuda/test_nccl.py tests/unit/backends/cuda/test_sched.py \
            tests/commands/test_selftest.py tests/unit/commbench/test_telemetry.py; do
    name=$(basename "$file" .py)
    run "$name" 120 "$PY" -m pytest -q -p no:cacheprovider -rA "${PER_TEST[@]}" \
        --junitxml "$WORK/junit/$name.xml" "$file"
done
