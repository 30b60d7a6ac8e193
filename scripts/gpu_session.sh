#!/usr/bin/env bash
# Reproduce pgmo's GPU results on a machine with an NVIDIA GPU, in one run.
# docs/reproducing-gpu-results.md says what to install first and what each file holds.
#
#   bash scripts/gpu_session.sh quick         first: the quick check, at most 8 minutes
#   bash scripts/gpu_session.sh [STEP...]     steps: quick tests traces malloc sanitizer demo mn bench
#
# Run "quick" first, on its own: python -m scripts.gpu_quick_check measures what the
# device layer must know (which allocation calls wait for queued kernels, the
# device memory each pool's run takes seen from outside the pool, the first
# iterations' times) in at most 8 minutes.  With no STEP it runs: tests traces
# malloc sanitizer demo mn (2.5 minutes on an H100 on 2026-11-25; 9.5 at most).
# "bench", the memory and speed tables, took 7.5 minutes there: run it on its
# own too (bash scripts/gpu_session.sh bench).  Every step runs under
# `timeout`, a step that fails or times out does not stop the next, and the
# whole run stays within SESSION_SECONDS.
#
# Results go to $OUT, at most 8 files:
#   session.log      every step's start, end and exit status, the GPU, the versions,
#                    and the summaries of the other files
#   pytest-gpu.log   pytest -m gpu (pass/fail counts on its last line)
#   traces.tar.gz    traces/*.json.gz from scripts.record_traces (what was
#                    written, also when the step timed out), DenseNet-BC with and
#                    without recomputation among them; after step bench also
#                    runs/*.run.json.gz, whole runs recorded from process start;
#                    after step quick also quick-check/quick-check.{json,md}, the
#                    quick check's raw results and report (its report is also in
#                    session.log)
#   bench_malloc.txt python -m scripts.bench_malloc --gpu
#   sanitizer.log    compute-sanitizer --tool memcheck runs (ERROR SUMMARY lines
#                    are copied into session.log)
#   demo.log         python -m pgmo demo
#   (step mn, two MPI ranks training on one GPU with a pgmo pool each, writes
#   its output into session.log)
#   results.md, bench_memory.log   scripts.bench_memory (step "bench" only; the
#                    DenseNet-BC recomputation table is its last section)
#
# Environment (all optional):
#   OUT              where results go (default /tmp/pgmo-out)
#   SCRATCH          working folder for wheels, traces and the demo picture
#                    (default ${TMPDIR:-/tmp}/pgmo-session); both may be relative
#                    to the folder the script is started from
#   PY               the Python to run (default python3)
#   SESSION_SECONDS  time for the whole run (default 570); a step gets at most
#                    what is left less 10 s, and is skipped when under 15 s is left
#   TIMEOUT_QUICK TIMEOUT_TESTS TIMEOUT_TRACES TIMEOUT_MALLOC TIMEOUT_SANITIZER_ONE_LINER
#   TIMEOUT_SANITIZER_CHAINER TIMEOUT_DEMO TIMEOUT_MN TIMEOUT_BENCH
#                    one step's limit in seconds (480 150 240 60 100 150 60 180 560)
#   SANITIZER        compute-sanitizer to use (default: on PATH, else /usr/local/cuda*/bin)
#   MPIEXEC          mpiexec to use (default: the one installed from .whl/, else the
#                    one beside $PY, else on PATH)
#
# Then: python -m scripts.results_table "$OUT" -o docs/results.md (the quick check's results
# included)
#
# pgmo and the programs of scripts/ (run as python -m scripts.NAME) are taken from this
# checkout (its root goes on PYTHONPATH, after the wheels' folder; setup compiles pgmo's
# hot path in place: python setup.py build_ext --inplace, which needs Cython).  Wheels
# in .whl/ (scripts/fetch_gpu_wheels.sh builds Chainer's) are installed into
# $SCRATCH/site, ahead of what the Python already has, except MPICH's, which
# goes to $SCRATCH/mpi (its library and mpiexec; LD_LIBRARY_PATH points there);
# without .whl/ the installed Chainer (and MPI) is used.
set -uo pipefail

OUT=${OUT:-/tmp/pgmo-out}
SCRATCH=${SCRATCH:-${TMPDIR:-/tmp}/pgmo-session}
mkdir -p "$OUT" "$SCRATCH"
OUT=$(cd "$OUT" && pwd) SCRATCH=$(cd "$SCRATCH" && pwd)  # relative to where it was started
cd "$(dirname "$0")/.."
SESSION_SECONDS=${SESSION_SECONDS:-570}
: "${TIMEOUT_QUICK:=480}" "${TIMEOUT_TESTS:=150}" "${TIMEOUT_TRACES:=240}" "${TIMEOUT_MALLOC:=60}" \
  "${TIMEOUT_SANITIZER_ONE_LINER:=100}" "${TIMEOUT_SANITIZER_CHAINER:=150}" \
  "${TIMEOUT_DEMO:=60}" "${TIMEOUT_MN:=180}" "${TIMEOUT_BENCH:=560}"
START=$(date +%s)
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
LOG="$OUT/session.log"
exec 3>&1  # the terminal, whatever a step's output is redirected to

say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG" >&3; }

# Seconds left for steps, keeping 10 s to wrap up.
left() { echo $(( SESSION_SECONDS - ($(date +%s) - START) - 10 )); }

# Seconds a step may run: its own limit, or what is left of the session.
budget() {
    local left; left=$(left)
    (( left < $1 )) && echo $(( left > 0 ? left : 1 )) || echo "$1"
}

# step NAME LIMIT COMMAND...: run COMMAND under timeout, log its status.
step() {
    local name=$1 cap; cap=$(budget "$2"); shift 2
    if (( $(left) < 15 )); then say "SKIP $name: session time used up"; return 0; fi
    say "BEGIN $name (timeout ${cap}s): $*"
    local t0=$(date +%s) rc=0
    timeout -k 10 "$cap" "$@" || rc=$?
    say "END $name: exit $rc after $(( $(date +%s) - t0 ))s$( ((rc == 124)) && echo ' (TIMED OUT)')"
    return 0
}

sanitizer_path() {
    if [[ -n "${SANITIZER:-}" ]]; then
        [[ -x "$SANITIZER" ]] && echo "$SANITIZER"
        return 0
    fi
    command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1
}

# The mpiexec for step mn: $MPIEXEC, MPICH's from .whl/, the one beside $PY, or on PATH.
mpiexec_path() {
    if [[ -n "${MPIEXEC:-}" ]]; then
        [[ -x "$MPIEXEC" ]] && echo "$MPIEXEC"
        return 0
    fi
    local candidate
    for candidate in "$SCRATCH/mpi/bin/mpiexec" "$(dirname "$(command -v "$PY")")/mpiexec"; do
        if [[ -x "$candidate" ]]; then echo "$candidate"; return 0; fi
    done
    command -v mpiexec || true
}

setup() {
    say "setup"
    local wheels=() mpich=() w
    if compgen -G ".whl/*.whl" >/dev/null; then
        for w in .whl/*.whl; do
            if [[ $(basename "$w") == mpich-* ]]; then mpich+=("$w"); else wheels+=("$w"); fi
        done
    else
        say "no .whl/: using the Chainer installed in $PY, if any"
    fi
    if (( ${#wheels[@]} )); then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SCRATCH/site" "${wheels[@]}" >>"$LOG" 2>&1 || say "WARNING: wheel install failed"
    fi
    # pip --target drops a wheel's data files (MPICH's lib/): MPICH gets a prefix of its own.
    if (( ${#mpich[@]} )); then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed \
            --prefix "$SCRATCH/mpi" "${mpich[@]}" >>"$LOG" 2>&1 || say "WARNING: MPICH install failed"
        export LD_LIBRARY_PATH="$SCRATCH/mpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    export PYTHONPATH="$SCRATCH/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    # pgmo runs from this checkout: compile its hot path here (Cython and a C compiler; a
    # no-op without Cython, and pgmo then runs as plain Python: the probe below says which).
    $PY setup.py -q build_ext --inplace >>"$LOG" 2>&1 || say "WARNING: compiling the hot path failed"
    {
        echo "pgmo commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
        $PY - <<'EOF' 2>&1
import platform, numpy, cupy
print("python", platform.python_version(), "numpy", numpy.__version__, "cupy", cupy.__version__)
print("device", cupy.cuda.runtime.getDeviceProperties(0)["name"])
import pgmo, pgmo.chainer, chainer
print("pgmo", pgmo.__version__, "from", pgmo.__file__, "chainer", chainer.__version__)
from pgmo.engine import compiled
print("pgmo hot path:", "compiled" if compiled() else "plain Python (not compiled)")
# Chainer 7.8.1 on this CuPy and NumPy: nothing on the CPU can check it.
import chainer.functions as F, chainer.links as L
from chainer.backends import cuda
print("chainer cuda available", cuda.available, "cudnn", cuda.cudnn_enabled)
link = L.Linear(4, 3)
link.to_device("@cupy:0")
loss = F.sum(F.relu(link(link.xp.ones((2, 4), "f"))))
loss.backward()
print("chainer forward/backward on the GPU ok:", float(loss.array), type(link.W.grad))
try:  # the process peaks of step bench (nvidia-ml-py); without it those columns read -
    import pynvml
    pynvml.nvmlInit()
    print("nvml: ok, driver", pynvml.nvmlSystemGetDriverVersion())
except Exception as error:
    print("nvml: not usable:", error)
try:  # step mn needs it; the other steps do not
    import mpi4py
    from mpi4py import MPI
    print("mpi4py", mpi4py.__version__, "with", MPI.Get_library_version().splitlines()[0].strip())
except Exception as error:
    print("mpi4py not usable:", error)
EOF
        echo "compute-sanitizer: $(sanitizer_path)"
        echo "mpiexec: $(mpiexec_path)"
    } >>"$LOG" 2>&1
}

# The quick check: its own budget is the step's limit less 30 s (its start and report), and
# it writes its files after every measurement, so a cut keeps what was measured.
run_quick() {
    local cap; cap=$(budget "$TIMEOUT_QUICK")
    rm -rf "$SCRATCH/quick-check"
    step quick "$cap" $PY -m scripts.gpu_quick_check --device 0 --out "$SCRATCH/quick-check" \
        --budget $(( cap > 60 ? cap - 30 : cap / 2 )) >>"$LOG" 2>&1
    archive
}

run_tests() {
    step tests "$TIMEOUT_TESTS" $PY -m pytest -m gpu -q -p no:cacheprovider -o addopts= tests \
        >"$OUT/pytest-gpu.log" 2>&1
    say "pytest: $(grep -E '(passed|failed|error|skipped|deselected)' "$OUT/pytest-gpu.log" | tail -n 1)"
}

# traces.tar.gz: the recorded traces (traces/), whole runs (runs/, step bench) and the quick
# check's results (quick-check/, step quick), whatever was written before a timeout or a failure.
archive() {
    local parts=() d
    for d in traces runs; do
        compgen -G "$SCRATCH/$d/*.json.gz" >/dev/null && parts+=("$d")
    done
    compgen -G "$SCRATCH/quick-check/quick-check.*" >/dev/null && parts+=(quick-check)
    (( ${#parts[@]} )) || return 0
    tar -czf "$OUT/traces.tar.gz" -C "$SCRATCH" "${parts[@]}"
    for d in "${parts[@]}"; do
        say "$d: $(ls "$SCRATCH/$d" | wc -l) files, $(du -sh "$SCRATCH/$d" | cut -f1)"
    done
}

run_traces() {
    rm -rf "$SCRATCH/traces"
    # One process per workload (--isolate): a model that fails or fills the device leaves
    # nothing behind for the next.
    step traces "$TIMEOUT_TRACES" $PY -m scripts.record_traces --device 0 --out-dir \
        "$SCRATCH/traces" --arch alexnet googlenet resnet50 inception-resnet-v2 \
        --batchsize 32 64 128 --inference --seq2seq 3 --densenet 64 --isolate >>"$LOG" 2>&1
    archive
}

run_malloc() {
    step malloc "$TIMEOUT_MALLOC" $PY -m scripts.bench_malloc --gpu >"$OUT/bench_malloc.txt" 2>&1
}

run_sanitizer() {
    local cs
    cs=$(sanitizer_path)
    if [[ -z "$cs" ]]; then say "SKIP sanitizer: compute-sanitizer not found"; return; fi
    : >"$OUT/sanitizer.log"
    step sanitizer-one-liner "$TIMEOUT_SANITIZER_ONE_LINER" "$cs" --tool memcheck \
        --leak-check no $PY examples/one_liner.py --device 0 --iterations 5 --batchsize 64 \
        --inputs 256 --hidden 128 --classes 10 >>"$OUT/sanitizer.log" 2>&1
    step sanitizer-chainer "$TIMEOUT_SANITIZER_CHAINER" "$cs" --tool memcheck \
        --leak-check no $PY examples/train_imagenet.py --device 0 --arch resnet50 --pool pgmo \
        --batchsize 4 --insize 64 --classes 10 --iterations 4 >>"$OUT/sanitizer.log" 2>&1
    local summaries; summaries=$(grep -h 'ERROR SUMMARY' "$OUT/sanitizer.log" | tr '\n' ' ')
    say "sanitizer: ${summaries:-no ERROR SUMMARY line (see sanitizer.log)}"
}

run_demo() {
    step demo "$TIMEOUT_DEMO" $PY -m pgmo demo -o "$SCRATCH/pgmo-demo.png" >"$OUT/demo.log" 2>&1
}

run_mn() {
    local mpiexec
    mpiexec=$(mpiexec_path)
    if [[ -z "$mpiexec" ]]; then say "SKIP mn: mpiexec not found (pip install 'pgmo[mpi]')"; return; fi
    # Two ranks: both on GPU 0 when it is the only one, else one GPU each.  Each saves its
    # plan in $SCRATCH/mn (emptied first: no plan from an earlier session is reused);
    # rank 0 prints every rank's pool statistics.
    rm -rf "$SCRATCH/mn"
    step mn "$TIMEOUT_MN" "$mpiexec" -n 2 $PY examples/train_mn.py --arch resnet50 \
        --batchsize 16 --insize 128 --classes 100 --iterations 12 --out "$SCRATCH/mn" \
        >>"$LOG" 2>&1
    local summary
    summary=$(grep -hE '^(parameters identical|pools optimized)' "$LOG" | tr '\n' ' ')
    say "mn: ${summary:-no summary lines (see the output above)}"
}

run_bench() {
    local cap; cap=$(budget "$TIMEOUT_BENCH")
    rm -rf "$SCRATCH/runs"
    # bench_memory stops starting configurations in time to write its report.
    step bench "$cap" $PY -m scripts.bench_memory --device 0 \
        --budget $(( cap > 80 ? cap - 40 : cap / 2 )) --run-dir "$SCRATCH/runs" \
        -o "$OUT/results.md" >"$OUT/bench_memory.log" 2>&1
    archive
}

steps=("$@")
(( ${#steps[@]} )) || steps=(tests traces malloc sanitizer demo mn)
setup
for s in "${steps[@]}"; do
    case $s in
        quick) run_quick ;;
        tests) run_tests ;;
        traces) run_traces ;;
        malloc) run_malloc ;;
        sanitizer) run_sanitizer ;;
        demo) run_demo ;;
        mn) run_mn ;;
        bench) run_bench ;;
        *) say "unknown step $s (steps: quick tests traces malloc sanitizer demo mn bench)" ;;
    esac
done
say "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
