#!/usr/bin/env bash
# Issue 5's GPU evidence in one script, for the device machine (run tool).
#
#   bash scripts/gpu_session.sh [STEP...]     steps: tests traces malloc sanitizer demo bench
#
# Default: tests traces malloc sanitizer demo (about 9 minutes at most); run
# "bench" as a second device command, since one command may run 10 minutes.
# Every step is time-boxed with `timeout` and the whole stays under
# SESSION_SECONDS (default 570).  Results go to $OUT (at most 8 files come
# back; this script writes at most 8):
#   session.log      every step's start, end, exit status, and the environment
#   pytest-gpu.log   pytest -m gpu (pass/fail counts on its last line)
#   traces.tar.gz    real traces from scripts/record_traces.py
#   bench_malloc.txt scripts/bench_malloc.py --gpu
#   sanitizer.log    compute-sanitizer --tool memcheck runs, with ERROR SUMMARY lines
#   demo.log         python -m pgmo demo
#   results.md, bench_memory.log   scripts/bench_memory.py
#
# The device has CuPy, NumPy, pytest, hypothesis and Chainer's dependencies
# but no Chainer: carry .whl (scripts/fetch_gpu_wheels.sh) in the run call.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pgmo-out}
mkdir -p "$OUT"
SESSION_SECONDS=${SESSION_SECONDS:-570}
START=$(date +%s)
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
LOG="$OUT/session.log"
exec 3>&1  # the terminal, whatever a step's output is redirected to

say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG" >&3; }

# Seconds a step may run: its own cap, or what is left of the session.
budget() {
    local left=$(( SESSION_SECONDS - ($(date +%s) - START) - 10 ))
    (( left < $1 )) && echo $(( left > 0 ? left : 1 )) || echo "$1"
}

# step NAME CAP COMMAND...: run COMMAND under timeout, log its status.
step() {
    local name=$1 cap; cap=$(budget "$2"); shift 2
    if (( cap < 15 )); then say "SKIP $name: session time used up"; return 0; fi
    say "BEGIN $name (timeout ${cap}s): $*"
    local t0=$(date +%s) rc=0
    timeout -k 10 "$cap" "$@" || rc=$?
    say "END $name: exit $rc after $(( $(date +%s) - t0 ))s$( ((rc == 124)) && echo ' (TIMED OUT)')"
    return 0
}

setup() {
    say "setup"
    if compgen -G ".whl/*.whl" >/dev/null; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || say "WARNING: wheel install failed"
    else
        say "WARNING: no .whl/ carried: Chainer is missing (run scripts/fetch_gpu_wheels.sh here)"
    fi
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
        $PY - <<'EOF' 2>&1
import platform, numpy, cupy
print("python", platform.python_version(), "numpy", numpy.__version__, "cupy", cupy.__version__)
print("device", cupy.cuda.runtime.getDeviceProperties(0)["name"])
import pgmo, pgmo.chainer, chainer
print("pgmo", pgmo.__version__, "from", pgmo.__file__, "chainer", chainer.__version__)
# Chainer 7.8.1 on this CuPy and NumPy: nothing on the CPU can check it.
import chainer.functions as F, chainer.links as L
from chainer.backends import cuda
print("chainer cuda available", cuda.available, "cudnn", cuda.cudnn_enabled)
link = L.Linear(4, 3)
link.to_device("@cupy:0")
loss = F.sum(F.relu(link(link.xp.ones((2, 4), "f"))))
loss.backward()
print("chainer forward/backward on the GPU ok:", float(loss.array), type(link.W.grad))
EOF
        command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>&1
    } >>"$LOG" 2>&1
}

run_tests() {
    step tests 150 $PY -m pytest -m gpu -q -p no:cacheprovider -o addopts= tests \
        >"$OUT/pytest-gpu.log" 2>&1
    say "pytest: $(grep -E '(passed|failed|error|skipped|deselected)' "$OUT/pytest-gpu.log" | tail -n 1)"
}

run_traces() {
    rm -rf /tmp/traces
    step traces 240 $PY scripts/record_traces.py --device 0 --out-dir /tmp/traces \
        --arch alexnet googlenet resnet50 inception-resnet-v2 --batchsize 32 64 128 \
        --inference --seq2seq 3 >>"$LOG" 2>&1
    # Whatever was written before a timeout still comes back.
    if compgen -G "/tmp/traces/*.json.gz" >/dev/null; then
        tar -czf "$OUT/traces.tar.gz" -C /tmp traces
        say "traces: $(ls /tmp/traces | wc -l) files, $(du -sh /tmp/traces | cut -f1)"
    fi
}

run_malloc() {
    step malloc 60 $PY scripts/bench_malloc.py --gpu >"$OUT/bench_malloc.txt" 2>&1
}

run_sanitizer() {
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
    if [[ -z "$cs" ]]; then say "SKIP sanitizer: compute-sanitizer not found"; return; fi
    : >"$OUT/sanitizer.log"
    step sanitizer-one-liner 100 "$cs" --tool memcheck --leak-check no \
        $PY examples/one_liner.py --device 0 --iterations 5 --batchsize 64 --inputs 256 \
        --hidden 128 --classes 10 >>"$OUT/sanitizer.log" 2>&1
    step sanitizer-chainer 150 "$cs" --tool memcheck --leak-check no \
        $PY examples/train_imagenet.py --device 0 --arch resnet50 --pool pgmo \
        --batchsize 4 --insize 64 --classes 10 --iterations 4 >>"$OUT/sanitizer.log" 2>&1
    say "sanitizer: $(grep -h 'ERROR SUMMARY' "$OUT/sanitizer.log" | tr '\n' ' ')"
}

run_demo() {
    step demo 60 $PY -m pgmo demo -o /tmp/pgmo-demo.png >"$OUT/demo.log" 2>&1
}

run_bench() {
    local cap; cap=$(budget 560)
    step bench "$cap" $PY scripts/bench_memory.py --device 0 --budget $(( cap - 40 )) \
        -o "$OUT/results.md" >"$OUT/bench_memory.log" 2>&1
}

steps=("$@")
(( ${#steps[@]} )) || steps=(tests traces malloc sanitizer demo)
setup
for s in "${steps[@]}"; do
    case $s in
        tests) run_tests ;;
        traces) run_traces ;;
        malloc) run_malloc ;;
        sanitizer) run_sanitizer ;;
        demo) run_demo ;;
        bench) run_bench ;;
        *) say "unknown step $s (steps: tests traces malloc sanitizer demo bench)" ;;
    esac
done
say "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
